//! `cohort job create|list|status|cancel`: the requester's side.

use crate::chain::{Chain, sol};
use crate::cli::{CHAIN_FLAGS, Flags, sol_to_lamports};
use anyhow::{Context, Result, anyhow, bail, ensure};
use cohort_engine::data::Corpus;
use cohort_engine::model::ModelConfig;
use cohort_program::client;
use cohort_program::state::{AccountState, Job, JobSpec, JobState, Requester};
use serde::Deserialize;
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::Signer;
use std::str::FromStr;

pub const USAGE: &str = "\
Usage:
  cohort job create [--spec FILE.toml] [--arch A] [--epochs N] [--steps-per-epoch N]
                    [--min-nodes N] [--max-nodes N] [--price SOL] [--stake SOL]
                    [--witnesses N] [--quorum N] [--audit-rate PCT] [--batch N] [--min-gflops N]
                    [--expected-epoch-secs S] [--max-epoch-secs S] [--join-window-secs S] [--id N]
  cohort job list
  cohort job status JOB
  cohort job cancel JOB          cancel, and withdraw what the job no longer owes
  cohort job withdraw JOB        take back what a finished job no longer owes
--id defaults to the requester's next job id (ids only go up: no job address is
ever reused).
Every command also takes --url URL (default http://127.0.0.1:8899), --keypair FILE
(default ~/.cohort/requester.json) and --program-id ID.
";

/// A job spec as written by a person (TOML file or flags). Prices in SOL.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SpecFile {
    pub arch: String,
    pub epochs: u32,
    pub steps_per_epoch: u32,
    pub min_nodes: u16,
    pub max_nodes: u16,
    /// Most the job pays one node for one full epoch.
    pub price: f64,
    pub stake: f64,
    pub witnesses: u8,
    pub quorum: u8,
    /// Percent of contributions the witnesses audit at random (those the
    /// screen flags are always audited).
    pub audit_rate: f64,
    /// Sequences per node per step.
    pub batch: u32,
    pub min_gflops: u32,
    pub expected_epoch_secs: u32,
    pub max_epoch_secs: u32,
    pub join_window_secs: u32,
}

impl Default for SpecFile {
    fn default() -> Self {
        Self {
            arch: ModelConfig::tiny().arch(),
            epochs: 2,
            steps_per_epoch: 20,
            min_nodes: 3,
            max_nodes: 4,
            price: 0.001,
            stake: 0.01,
            witnesses: 3,
            quorum: 2,
            audit_rate: 2.0,
            batch: 8,
            // The probe is one thread and jitters under load: a low floor by default.
            min_gflops: 1,
            expected_epoch_secs: 600,
            max_epoch_secs: 3600,
            join_window_secs: 3600,
        }
    }
}

const SPEC_FLAGS: [&str; 15] = [
    "arch",
    "epochs",
    "steps-per-epoch",
    "min-nodes",
    "max-nodes",
    "price",
    "stake",
    "witnesses",
    "quorum",
    "audit-rate",
    "batch",
    "min-gflops",
    "expected-epoch-secs",
    "max-epoch-secs",
    "join-window-secs",
];

impl SpecFile {
    /// `--spec FILE` first, then each flag overrides its field.
    pub fn from_flags(f: &Flags) -> Result<Self> {
        let mut s = match f.str("spec") {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read job spec {path}"))?;
                toml::from_str::<SpecFile>(&text)
                    .map_err(|e| anyhow!("job spec {path}: {}", e.message()))?
            }
            None => Self::default(),
        };
        macro_rules! set {
            ($field:ident, $flag:literal) => {
                if let Some(v) = f.get($flag)? {
                    s.$field = v;
                }
            };
        }
        set!(arch, "arch");
        set!(epochs, "epochs");
        set!(steps_per_epoch, "steps-per-epoch");
        set!(min_nodes, "min-nodes");
        set!(max_nodes, "max-nodes");
        set!(price, "price");
        set!(stake, "stake");
        set!(witnesses, "witnesses");
        set!(quorum, "quorum");
        set!(audit_rate, "audit-rate");
        set!(batch, "batch");
        set!(min_gflops, "min-gflops");
        set!(expected_epoch_secs, "expected-epoch-secs");
        set!(max_epoch_secs, "max-epoch-secs");
        set!(join_window_secs, "join-window-secs");
        Ok(s)
    }

    /// The on-chain spec, or the first thing wrong with this one, in words.
    pub fn to_spec(&self, dataset_id: [u8; 32]) -> Result<JobSpec> {
        let model =
            ModelConfig::parse(&self.arch).map_err(|e| anyhow!("arch `{}`: {e}", self.arch))?;
        ensure!(self.epochs > 0, "epochs must be at least 1");
        ensure!(
            self.steps_per_epoch > 0,
            "steps-per-epoch must be at least 1"
        );
        ensure!(self.batch > 0, "batch must be at least 1");
        ensure!(self.min_nodes > 0, "min-nodes must be at least 1");
        ensure!(
            self.min_nodes <= self.max_nodes,
            "min-nodes ({}) must not exceed max-nodes ({})",
            self.min_nodes,
            self.max_nodes
        );
        ensure!(
            (1..=cohort_program::state::MAX_WITNESSES as u8).contains(&self.witnesses),
            "witnesses must be between 1 and {}",
            cohort_program::state::MAX_WITNESSES
        );
        ensure!(
            self.witnesses as u16 <= self.min_nodes,
            "witnesses ({}) must not exceed min-nodes ({})",
            self.witnesses,
            self.min_nodes
        );
        ensure!(
            (self.quorum as u16) * 2 > self.witnesses as u16 && self.quorum <= self.witnesses,
            "quorum ({}) must be a strict majority of the {} witnesses",
            self.quorum,
            self.witnesses
        );
        ensure!(
            (0.0..=100.0).contains(&self.audit_rate),
            "audit-rate is a percentage of contributions: 0 to 100, not {}",
            self.audit_rate
        );
        ensure!(self.max_epoch_secs > 0, "max-epoch-secs must be at least 1");
        ensure!(
            self.join_window_secs > 0,
            "join-window-secs must be at least 1"
        );
        let mut spec = JobSpec {
            model_hash: model.config_hash(),
            arch: [0; 64],
            recipe_hash: [0; 32],
            dataset_id,
            global_batch: self
                .batch
                .checked_mul(self.max_nodes as u32)
                .context("batch × max-nodes overflows")?,
            seq_len: model.seq_len as u32,
            steps_per_epoch: self.steps_per_epoch,
            epochs: self.epochs,
            expected_epoch_secs: self.expected_epoch_secs,
            max_epoch_secs: self.max_epoch_secs,
            join_window_secs: self.join_window_secs,
            min_nodes: self.min_nodes,
            max_nodes: self.max_nodes,
            min_fp32_gflops: self.min_gflops,
            max_price: sol_to_lamports(self.price, "price")?,
            min_stake: sol_to_lamports(self.stake, "stake")?,
            witness_count: self.witnesses,
            quorum: self.quorum,
            audit_rate_bp: (self.audit_rate * 100.0).round() as u16,
        };
        spec.set_arch(&model.arch());
        // The job commits to how this build trains it; members on another
        // build refuse it (`recipe::check`).
        let train = cohort_engine::recipe::for_job(&spec).context("job recipe")?;
        spec.recipe_hash = cohort_engine::recipe::hash(&train);
        spec.validate().map_err(|e| anyhow!("job spec: {e}"))?;
        spec.full_budget()
            .context("price × max-nodes × epochs overflows")?;
        Ok(spec)
    }
}

pub async fn main(args: &[String]) -> Result<()> {
    let Some(cmd) = args.first() else {
        print!("{USAGE}");
        return Ok(());
    };
    let rest = &args[1..];
    match cmd.as_str() {
        "create" => {
            let mut allowed = CHAIN_FLAGS.to_vec();
            allowed.extend(SPEC_FLAGS);
            allowed.extend(["spec", "id"]);
            let f = Flags::parse(rest, "cohort job create", &allowed)?;
            let spec = SpecFile::from_flags(&f)?;
            let corpus = Corpus::bundled()?;
            let spec = spec.to_spec(corpus.id)?;
            let chain = f.chain().await?;
            let who = f.keypair("requester.json")?;
            let id = match f.get::<u64>("id")? {
                Some(id) => id,
                None => next_id(&chain, &who.pubkey()).await?,
            };
            let job = create(&chain, &who, id, spec).await?;
            println!("job {job} posted");
            Ok(())
        }
        "list" => {
            let f = Flags::parse(rest, "cohort job list", &CHAIN_FLAGS)?;
            let chain = f.chain().await?;
            let mut jobs = chain.all::<Job>().await?;
            jobs.sort_by_key(|(_, j)| std::cmp::Reverse(j.created_at));
            if jobs.is_empty() {
                println!("no jobs on this chain");
            }
            for (k, j) in jobs {
                println!("{}", line(&k, &j));
            }
            Ok(())
        }
        "status" => {
            let f = Flags::parse(rest, "cohort job status", &CHAIN_FLAGS)?;
            let job = job_arg(&f)?;
            let chain = f.chain().await?;
            let j: Job = chain.must(&job, "job").await?;
            print!("{}", status(&job, &j));
            Ok(())
        }
        "cancel" => {
            let f = Flags::parse(rest, "cohort job cancel", &CHAIN_FLAGS)?;
            let job = job_arg(&f)?;
            let chain = f.chain().await?;
            let who = f.keypair("requester.json")?;
            let refund = cancel(&chain, &who, &job).await?;
            println!("job {job} cancelled: {} refunded", sol(refund));
            Ok(())
        }
        "withdraw" => {
            let f = Flags::parse(rest, "cohort job withdraw", &CHAIN_FLAGS)?;
            let job = job_arg(&f)?;
            let chain = f.chain().await?;
            let who = f.keypair("requester.json")?;
            let refund = withdraw(&chain, &who, &job).await?;
            println!("job {job}: {} withdrawn", sol(refund));
            Ok(())
        }
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown job command `{other}`; run `cohort job help`"),
    }
}

fn job_arg(f: &Flags) -> Result<Pubkey> {
    let [job] = f.words.as_slice() else {
        bail!("expected one job address");
    };
    Pubkey::from_str(job).map_err(|_| anyhow!("`{job}` is not a job address"))
}

/// Posts a job with its full deposit. Checks funds first so a short wallet
/// is an error before anything is signed.
pub async fn create(
    chain: &Chain,
    who: &solana_sdk::signature::Keypair,
    id: u64,
    spec: JobSpec,
) -> Result<Pubkey> {
    let deposit = spec.full_budget().context("job budget overflows")?;
    let ids = chain
        .state::<Requester>(&client::requester_address(&who.pubkey()))
        .await?;
    let rent_of = |len: usize| async move {
        chain
            .rpc
            .get_minimum_balance_for_rent_exemption(len)
            .await
            .map_err(|e| anyhow!("reading rent: {e}"))
    };
    let mut rent = rent_of(Job::LEN).await?;
    // The first job also creates the requester's id counter.
    if ids.is_none() {
        rent += rent_of(Requester::LEN).await?;
    }
    let need = deposit + rent + 10_000;
    let have = chain.balance(&who.pubkey()).await?;
    if have < need {
        bail!(
            "insufficient funds: the deposit is {} (plus {} rent and fees) but {} holds {}",
            sol(deposit),
            sol(rent + 10_000),
            who.pubkey(),
            sol(have)
        );
    }
    let job = client::job_address(&who.pubkey(), id);
    if chain.state::<Job>(&job).await?.is_some() {
        bail!("job id {id} is already used by {job}; pass another --id");
    }
    let next = ids.map_or(0, |r| r.next_job_id);
    if id < next {
        bail!(
            "job id {id} was already used by {} (its next job id is {next}): ids only go \
             up, so no job address is ever reused; pass --id {next} or more, or leave --id out",
            who.pubkey()
        );
    }
    chain
        .send(
            "create_job",
            &[client::create_job(&who.pubkey(), id, spec, deposit)],
            who,
            &[],
        )
        .await?;
    Ok(job)
}

/// The lowest job id the program accepts from `requester` now.
pub async fn next_id(chain: &Chain, requester: &Pubkey) -> Result<u64> {
    let ids = chain
        .state::<Requester>(&client::requester_address(requester))
        .await?;
    Ok(ids.map_or(0, |r| r.next_job_id))
}

/// The job at `job`, which `who` must have posted.
async fn own_job(chain: &Chain, who: &solana_sdk::signature::Keypair, job: &Pubkey) -> Result<Job> {
    let j: Job = chain.must(job, "job").await?;
    if j.requester != who.pubkey() {
        bail!(
            "job {job} belongs to {}, not to {}",
            j.requester,
            who.pubkey()
        );
    }
    Ok(j)
}

/// Cancels an open or running job and withdraws what it no longer owes or
/// reserves (one transaction); returns the lamports refunded.
pub async fn cancel(
    chain: &Chain,
    who: &solana_sdk::signature::Keypair,
    job: &Pubkey,
) -> Result<u64> {
    let j = own_job(chain, who, job).await?;
    if j.state.is_terminal() {
        bail!("job {job} has already ended ({:?})", j.state);
    }
    let mut ixs = vec![client::cancel_job(&who.pubkey(), job)];
    // What an open epoch may still earn stays reserved until it ends.
    let mut cancelled = j.clone();
    cancelled.state = JobState::Cancelled;
    if cancelled.refundable().is_some_and(|r| r > 0) {
        ixs.push(client::withdraw(&who.pubkey(), job));
    }
    chain.send("cancel_job", &ixs, who, &[]).await?;
    let after: Job = chain.must(job, "job").await?;
    Ok(after.refunded - j.refunded)
}

/// Pulls what a finished job no longer owes or reserves (the program never
/// pushes refunds); returns the lamports withdrawn.
pub async fn withdraw(
    chain: &Chain,
    who: &solana_sdk::signature::Keypair,
    job: &Pubkey,
) -> Result<u64> {
    let j = own_job(chain, who, job).await?;
    if !j.state.is_terminal() {
        bail!(
            "job {job} is still {:?}: its deposit funds the epochs to come",
            j.state
        );
    }
    let amount = withdrawable(&j);
    if amount == 0 {
        bail!("nothing to withdraw from job {job}");
    }
    chain
        .send(
            "withdraw",
            &[client::withdraw(&who.pubkey(), job)],
            who,
            &[],
        )
        .await?;
    let after: Job = chain.must(job, "job").await?;
    Ok(after.refunded - j.refunded)
}

/// What the requester could withdraw now: a finished job's deposit beyond
/// what members are owed (0 while the job runs).
pub fn withdrawable(j: &Job) -> u64 {
    if j.state.is_terminal() {
        j.refundable().unwrap_or(0)
    } else {
        0
    }
}

fn line(k: &Pubkey, j: &Job) -> String {
    format!(
        "{k}  {:<9}  {:<20}  nodes {}/{}  epochs {}/{}  {} per node-epoch",
        format!("{:?}", j.state),
        j.spec.arch_str(),
        j.member_count,
        j.spec.max_nodes,
        j.epochs_finalized,
        j.spec.epochs,
        sol(j.spec.max_price)
    )
}

pub fn status(k: &Pubkey, j: &Job) -> String {
    let mut s = String::new();
    s.push_str(&format!("job        {k}\n"));
    s.push_str(&format!("state      {:?}\n", j.state));
    s.push_str(&format!("model      {}\n", j.spec.arch_str()));
    s.push_str(&format!(
        "nodes      {} joined (min {}, max {})\n",
        j.member_count, j.spec.min_nodes, j.spec.max_nodes
    ));
    s.push_str(&format!(
        "epochs     {} attested, {} started, of {} ({} steps each)\n",
        j.epochs_finalized, j.epochs_started, j.spec.epochs, j.spec.steps_per_epoch
    ));
    s.push_str(&format!(
        "witnesses  {} per epoch, quorum {}, {}% of contributions audited at random\n",
        j.spec.witness_count,
        j.spec.quorum,
        f64::from(j.spec.audit_rate_bp) / 100.0
    ));
    s.push_str(&format!(
        "deposit    {} ({} lamports)\n",
        sol(j.deposit),
        j.deposit
    ));
    // Refunds are pulled: "refunded" counts what is withdrawn and what a
    // finished job holds ready to withdraw, so deposit = owed + refunded.
    let ready = withdrawable(j);
    let back = j.refunded + ready;
    s.push_str(&format!(
        "spend      {} owed to nodes, {} paid out, {} refunded (lamports: {} {} {})\n",
        sol(j.owed),
        sol(j.paid_out),
        sol(back),
        j.owed,
        j.paid_out,
        back
    ));
    if ready > 0 {
        s.push_str(&format!(
            "withdraw   {} ready: `cohort job withdraw {k}` ({} lamports)\n",
            sol(ready),
            ready
        ));
    }
    if j.slashed > 0 {
        s.push_str(&format!(
            "slashed    {} of stake taken from nodes caught cheating, burned ({} lamports)\n",
            sol(j.slashed),
            j.slashed
        ));
    }
    if j.state == JobState::Running || j.epochs_finalized > 0 {
        s.push_str(&format!(
            "model hash {}\n",
            j.latest_model_hash[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(v: &[&str]) -> Result<SpecFile> {
        let args: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        let mut allowed = CHAIN_FLAGS.to_vec();
        allowed.extend(SPEC_FLAGS);
        allowed.extend(["spec", "id"]);
        SpecFile::from_flags(&Flags::parse(&args, "cohort job create", &allowed)?)
    }

    fn err(v: &[&str]) -> String {
        match flags(v).and_then(|s| s.to_spec([0; 32])) {
            Ok(_) => panic!("{v:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_default_spec_is_valid_and_flags_override_it() {
        let s = flags(&["--epochs", "5", "--price", "0.5"]).unwrap();
        assert_eq!((s.epochs, s.price), (5, 0.5));
        let spec = s.to_spec([1; 32]).unwrap();
        assert_eq!(spec.max_price, 500_000_000);
        assert_eq!(spec.audit_rate_bp, 200);
        let s = flags(&["--audit-rate", "12.5"]).unwrap();
        assert_eq!(s.to_spec([1; 32]).unwrap().audit_rate_bp, 1250);
        assert_eq!(spec.arch_str(), ModelConfig::tiny().arch());
    }

    #[test]
    fn invalid_specs_are_one_line_errors_naming_the_field() {
        assert!(
            err(&["--min-nodes", "5", "--max-nodes", "3"])
                .contains("min-nodes (5) must not exceed max-nodes (3)")
        );
        assert!(err(&["--quorum", "1"]).contains("strict majority"));
        assert!(err(&["--audit-rate", "101"]).contains("audit-rate is a percentage"));
        assert!(err(&["--arch", "gpt l0"]).contains("arch `gpt l0`"));
        assert!(err(&["--price", "-1"]).contains("price must be a positive amount"));
        assert!(err(&["--epochs", "x"]).contains("--epochs `x`"));
        assert!(err(&["--bogus", "1"]).contains("unknown option `--bogus`"));
        for e in [
            err(&["--epochs", "0"]),
            err(&["--witnesses", "9", "--min-nodes", "4"]),
        ] {
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn spec_files_are_read_and_unknown_keys_refused() {
        let dir = std::env::temp_dir().join(format!("cohort-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(&good, "arch = \"gpt l2 d64 h4 s64\"\nepochs = 3\nsteps-per-epoch = 10\nmin-nodes = 3\nmax-nodes = 3\nprice = 0.002\nstake = 0.01\nwitnesses = 3\nquorum = 2\nbatch = 4\nmin-gflops = 1\nexpected-epoch-secs = 60\nmax-epoch-secs = 600\njoin-window-secs = 600\n").unwrap();
        let s = flags(&["--spec", good.to_str().unwrap(), "--epochs", "4"]).unwrap();
        assert_eq!((s.epochs, s.steps_per_epoch, s.batch), (4, 10, 4));
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "epochz = 3\n").unwrap();
        let e = flags(&["--spec", bad.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `epochz`"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
