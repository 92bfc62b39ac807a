//! The wallet: BIP39 phrases derived the way Phantom and Solflare do
//! (`m/44'/501'/0'/0'`, SLIP-0010 ed25519), Solana CLI keypair imports, and
//! an encrypted keystore on disk.

pub mod cli;
pub mod derive;
pub mod keystore;
