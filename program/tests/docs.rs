//! `docs/program.md` states each account's size and rent; this keeps it true.

use cohort_program::state::*;
use solana_sdk::rent::Rent;

fn documented(row: &str) -> Option<(usize, u64)> {
    let doc = include_str!("../../docs/program.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with(&format!("| `{row}` |")))?;
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    Some((
        cells[2].parse().ok()?,
        cells[3].replace(',', "").parse().ok()?,
    ))
}

#[test]
fn account_sizes_and_rent_in_docs_match_the_code() {
    let rent = Rent::default();
    for (name, len) in [
        ("Node", Node::LEN),
        ("Job", Job::LEN),
        ("Member", Member::LEN),
        ("Epoch", Epoch::LEN),
        ("Requester", Requester::LEN),
        ("FraudCase", FraudCase::LEN),
    ] {
        let want = (len, rent.minimum_balance(len));
        assert_eq!(
            documented(name),
            Some(want),
            "docs/program.md row for {name}; code says {want:?}"
        );
    }
}
