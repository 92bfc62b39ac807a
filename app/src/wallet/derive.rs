//! Phrase → key. BIP39 turns the phrase into a 64-byte seed (PBKDF2-HMAC-
//! SHA512, 2048 rounds); SLIP-0010 walks hardened ed25519 children from it.
//! Solana wallets use `m/44'/501'/account'/0'`.

use anyhow::{Result, anyhow};
use bip39::{Language, Mnemonic};
use hmac::{Hmac, Mac};
use sha2::Sha512;
use solana_sdk::signature::Keypair;
use zeroize::Zeroizing;

type HmacSha512 = Hmac<Sha512>;
const HARDENED: u32 = 0x8000_0000;

/// A new random phrase of 12 or 24 words.
pub fn new_phrase(words: usize) -> Result<Zeroizing<String>> {
    let m = match words {
        12 | 24 => Mnemonic::generate_in(Language::English, words)
            .map_err(|e| anyhow!("generating a phrase: {e}"))?,
        _ => return Err(anyhow!("a phrase has 12 or 24 words, not {words}")),
    };
    Ok(Zeroizing::new(m.to_string()))
}

/// Checks a phrase (words and checksum) and normalizes its spacing/case.
pub fn parse_phrase(phrase: &str) -> Result<Zeroizing<String>> {
    let clean = phrase
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    let m = Mnemonic::parse_in(Language::English, &clean)
        .map_err(|e| anyhow!("invalid recovery phrase: {e}"))?;
    Ok(Zeroizing::new(m.to_string()))
}

/// SLIP-0010 ed25519: the private key (and chain code) at a hardened path.
pub fn slip10(seed: &[u8], path: &[u32]) -> ([u8; 32], [u8; 32]) {
    let mac = |key: &[u8], data: &[u8]| -> Zeroizing<[u8; 64]> {
        let mut m = HmacSha512::new_from_slice(key).expect("HMAC takes any key length");
        m.update(data);
        let mut out = Zeroizing::new([0u8; 64]);
        out.copy_from_slice(&m.finalize().into_bytes());
        out
    };
    let mut i = mac(b"ed25519 seed", seed);
    for &index in path {
        let mut data = Zeroizing::new(Vec::with_capacity(37));
        data.push(0);
        data.extend_from_slice(&i[..32]);
        data.extend_from_slice(&(index | HARDENED).to_be_bytes());
        i = mac(&i[32..], &data);
    }
    let mut key = [0u8; 32];
    let mut chain = [0u8; 32];
    key.copy_from_slice(&i[..32]);
    chain.copy_from_slice(&i[32..]);
    (key, chain)
}

/// The Solana account `account` of a phrase (Phantom's first account is 0).
pub fn keypair_from_phrase(phrase: &str, account: u32) -> Result<Keypair> {
    let m = Mnemonic::parse_in(Language::English, phrase)
        .map_err(|e| anyhow!("invalid recovery phrase: {e}"))?;
    let seed = Zeroizing::new(m.to_seed(""));
    let (key, _) = slip10(&seed[..], &[44, 501, account, 0]);
    let key = Zeroizing::new(key);
    Ok(Keypair::new_from_array(*key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use solana_sdk::signature::Signer;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn slip10_matches_the_specs_first_vector() {
        // satoshilabs/slips slip-0010.md, ed25519 test vector 1.
        let seed = [0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
        let (k, c) = slip10(&seed, &[]);
        assert_eq!(
            hex(&k),
            "2b4be7f19ee27bbf30c667b642d5f4aa69fd169872f8fc3059c08ebae2eb19e7"
        );
        assert_eq!(
            hex(&c),
            "90046a93de5380a72b5e45010748567d5ea02bbf6522f979e05c0d8d8ca9fffb"
        );
        let (k, c) = slip10(&seed, &[0, 1]);
        assert_eq!(
            hex(&k),
            "b1d0bad404bf35da785a64ca1ac54b2617211d2777696fbffaf208f746ae84f2"
        );
        assert_eq!(
            hex(&c),
            "a320425f77d1b5c2505a6b1b27382b37368ee640e3557c315416801243552f14"
        );
    }

    #[test]
    fn phrases_derive_the_addresses_phantom_and_trezor_show() {
        // trezor-firmware common/tests/fixtures/solana/get_address.json
        let k = keypair_from_phrase("all all all all all all all all all all all all", 0).unwrap();
        assert_eq!(
            k.pubkey().to_string(),
            "14CCvQzQzHCVgZM3j9soPnXuJXh1RmCfwLVUcdfbZVBS"
        );
        let k = keypair_from_phrase("all all all all all all all all all all all all", 1).unwrap();
        assert_eq!(
            k.pubkey().to_string(),
            "CqPFGxxzrE2bgLGC98x9rYix7Nq17mh8L7pWseJt3c9N"
        );
        // solana.com cookbook, "restore a keypair from a mnemonic" (BIP44).
        let phrase = "neither lonely flavor argue grass remind eye tag avocado spot unusual intact";
        let k = keypair_from_phrase(phrase, 0).unwrap();
        assert_eq!(
            k.pubkey().to_string(),
            "5vftMkHL72JaJG6ExQfGAsT2uGVHpRR7oTNUPMs68Y2N"
        );
    }

    #[test]
    fn new_phrases_have_the_asked_length_and_bad_ones_are_refused() {
        for n in [12, 24] {
            let p = new_phrase(n).unwrap();
            assert_eq!(p.split(' ').count(), n);
            assert_eq!(*parse_phrase(&p.to_uppercase()).unwrap(), *p);
        }
        assert!(new_phrase(13).is_err());
        let e = parse_phrase("all all all all all all all all all all all alll").unwrap_err();
        assert!(e.to_string().contains("invalid recovery phrase"), "{e}");
        // Valid words, wrong checksum.
        assert!(parse_phrase("all all all all all all all all all all all abandon").is_err());
    }
}
