//! The chain layer: one `RpcClient` code path for real clusters, for
//! `cohort localnet` over HTTP, and for the embedded chain in-process.
//! Every Cohort call the app and the node make goes through [`Chain`].

pub mod embedded;
pub mod keys;
pub mod localnet;

use anyhow::{Context, Result, anyhow, bail};
use cohort_program::error::CohortError;
use cohort_program::state::AccountState;
use solana_commitment_config::CommitmentConfig;
use solana_rpc_client::nonblocking::rpc_client::RpcClient;
use solana_rpc_client_api::client_error::{Error as ClientError, ErrorKind};
use solana_rpc_client_api::config::{RpcAccountInfoConfig, RpcProgramAccountsConfig};
use solana_rpc_client_api::filter::{Memcmp, RpcFilterType};
use solana_rpc_client_api::request::{RpcError, RpcResponseErrorData};
use solana_rpc_client_api::response::UiAccountEncoding;
use solana_sdk::hash::Hash;
use solana_sdk::instruction::{Instruction, InstructionError};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signature, Signer};
use solana_sdk::transaction::{Transaction, TransactionError};
use std::time::Duration;

pub const LAMPORTS_PER_SOL: u64 = 1_000_000_000;
/// Sends are retried this many times on transport errors.
const ATTEMPTS: u32 = 6;

pub fn sol(lamports: u64) -> String {
    format!("{:.6} SOL", lamports as f64 / LAMPORTS_PER_SOL as f64)
}

pub struct Chain {
    pub rpc: RpcClient,
    label: String,
    sent: std::sync::atomic::AtomicU64,
}

impl Chain {
    /// Wraps a client (the embedded chain's, or one built elsewhere).
    pub fn new(rpc: RpcClient, label: impl Into<String>) -> Self {
        Self {
            rpc,
            label: label.into(),
            sent: Default::default(),
        }
    }

    /// Transactions confirmed through this client.
    pub fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Connects to a cluster's JSON-RPC and checks the Cohort program is
    /// there: an unreachable URL or a wrong program id is a one-line error
    /// before anything is signed.
    pub async fn connect(url: &str, program_id: &Pubkey) -> Result<Self> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("invalid RPC URL `{url}`: expected http:// or https://");
        }
        let rpc = RpcClient::new_with_timeout_and_commitment(
            url.to_string(),
            Duration::from_secs(10),
            CommitmentConfig::confirmed(),
        );
        let chain = Self::new(rpc, url);
        chain.check(program_id).await?;
        Ok(chain)
    }

    pub async fn check(&self, program_id: &Pubkey) -> Result<()> {
        self.rpc
            .get_version()
            .await
            .map_err(|e| anyhow!("cannot reach the chain at {}: {}", self.label, short(&e)))?;
        if *program_id != cohort_program::ID {
            bail!(
                "wrong program id {program_id}: this build of cohort speaks to the Cohort program {}",
                cohort_program::ID
            );
        }
        let acc = self
            .rpc
            .get_account_with_commitment(program_id, self.rpc.commitment())
            .await
            .map_err(|e| anyhow!("cannot reach the chain at {}: {}", self.label, short(&e)))?
            .value;
        match acc {
            Some(a) if a.executable => Ok(()),
            _ => bail!(
                "the Cohort program {program_id} is not deployed on {}",
                self.label
            ),
        }
    }

    /// Signs once and sends until confirmed. Transport errors are retried
    /// with back-off by re-sending the *same* signed transaction, which the
    /// chain executes at most once; a new blockhash is used only once the
    /// old one has expired with the transaction not on chain, so a retry
    /// can never pay or act twice.
    pub async fn send(
        &self,
        what: &str,
        ixs: &[Instruction],
        payer: &Keypair,
        signers: &[&Keypair],
    ) -> Result<Signature> {
        let mut all = vec![payer];
        all.extend_from_slice(signers);
        let sign = |h: Hash| {
            Some(Transaction::new_signed_with_payer(
                ixs,
                Some(&payer.pubkey()),
                &all,
                h,
            ))
        };
        self.deliver(what, None, &sign).await
    }

    /// Sends a transaction several parties signed (a fraud report and its
    /// witnesses' co-signatures). It cannot be signed again, so it is
    /// retried only while its blockhash lives.
    pub async fn send_signed(&self, what: &str, t: Transaction) -> Result<Signature> {
        self.deliver(what, Some(t), &|_| None).await
    }

    async fn deliver(
        &self,
        what: &str,
        mut tx: Option<Transaction>,
        sign: &(dyn Fn(Hash) -> Option<Transaction> + Sync),
    ) -> Result<Signature> {
        let mut wait = Duration::from_millis(250);
        for attempt in 1..=ATTEMPTS {
            let t = match tx.take() {
                Some(t) => t,
                None => {
                    let blockhash = self
                        .rpc
                        .get_latest_blockhash()
                        .await
                        .map_err(|e| self.fail(what, e));
                    match blockhash {
                        Ok(h) => sign(h).ok_or_else(|| {
                            anyhow!("{what}: its blockhash expired before it landed")
                        })?,
                        Err(e) if attempt < ATTEMPTS => {
                            log_retry(what, &e, wait);
                            tokio::time::sleep(wait).await;
                            wait *= 2;
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            let sig = t.signatures[0];
            match self.rpc.send_and_confirm_transaction(&t).await {
                Ok(s) => {
                    self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(s);
                }
                Err(e) if transient(&e) && attempt < ATTEMPTS => {
                    log_retry(what, &self.fail(what, e), wait);
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    // Landed after all? Then it is done.
                    if let Ok(Some(r)) = self.rpc.get_signature_status(&sig).await {
                        if r.is_ok() {
                            self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        return r.map(|_| sig).map_err(|e| explain(what, &e));
                    }
                    let live = self
                        .rpc
                        .is_blockhash_valid(&t.message.recent_blockhash, self.rpc.commitment())
                        .await
                        .unwrap_or(true);
                    if live {
                        tx = Some(t);
                    }
                }
                Err(e) => return Err(self.fail(what, e)),
            }
        }
        bail!("{what}: gave up after {ATTEMPTS} attempts")
    }

    fn fail(&self, what: &str, e: ClientError) -> anyhow::Error {
        if let Some(te) = e.get_transaction_error() {
            return explain(what, &te);
        }
        anyhow!("{what}: {} ({})", short(&e), self.label)
    }

    pub async fn state<T: AccountState>(&self, k: &Pubkey) -> Result<Option<T>> {
        let a = self
            .rpc
            .get_account_with_commitment(k, self.rpc.commitment())
            .await
            .map_err(|e| anyhow!("reading {k}: {}", short(&e)))?
            .value;
        match a {
            None => Ok(None),
            Some(a) if a.owner != cohort_program::ID => {
                bail!("account {k} is not a Cohort account")
            }
            Some(a) => T::decode(&a.data)
                .map(Some)
                .map_err(|e| anyhow!("account {k}: {e}")),
        }
    }

    /// Any account's data (a sysvar, say), not only Cohort's.
    pub async fn data(&self, k: &Pubkey) -> Result<Option<Vec<u8>>> {
        Ok(self
            .rpc
            .get_account_with_commitment(k, self.rpc.commitment())
            .await
            .map_err(|e| anyhow!("reading {k}: {}", short(&e)))?
            .value
            .map(|a| a.data))
    }

    pub async fn must<T: AccountState>(&self, k: &Pubkey, what: &str) -> Result<T> {
        self.state(k)
            .await?
            .with_context(|| format!("{what} {k} not found"))
    }

    /// Every Cohort account of one type (jobs, nodes, …).
    pub async fn all<T: AccountState>(&self) -> Result<Vec<(Pubkey, T)>> {
        let config = RpcProgramAccountsConfig {
            filters: Some(vec![
                RpcFilterType::DataSize(T::LEN as u64),
                RpcFilterType::Memcmp(Memcmp::new_raw_bytes(0, vec![T::TYPE as u8])),
            ]),
            account_config: RpcAccountInfoConfig {
                encoding: Some(UiAccountEncoding::Base64),
                commitment: Some(self.rpc.commitment()),
                ..Default::default()
            },
            ..Default::default()
        };
        let list = self
            .rpc
            .get_program_ui_accounts_with_config(&cohort_program::ID, config)
            .await
            .map_err(|e| anyhow!("listing accounts: {}", short(&e)))?;
        let mut out = Vec::new();
        for (k, ui) in list {
            let Some(a) = ui.to_account() else { continue };
            if let Ok(s) = T::decode(&a.data) {
                out.push((k, s));
            }
        }
        Ok(out)
    }

    pub async fn balance(&self, k: &Pubkey) -> Result<u64> {
        self.rpc
            .get_balance(k)
            .await
            .map_err(|e| anyhow!("balance of {k}: {}", short(&e)))
    }

    /// Local chains only: real clusters refuse or rate-limit airdrops.
    pub async fn airdrop(&self, to: &Pubkey, lamports: u64) -> Result<()> {
        let sig = self
            .rpc
            .request_airdrop(to, lamports)
            .await
            .map_err(|e| anyhow!("airdrop to {to}: {}", short(&e)))?;
        for _ in 0..40 {
            if let Ok(Some(r)) = self.rpc.get_signature_status(&sig).await {
                return r.map_err(|e| anyhow!("airdrop to {to}: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("airdrop to {to} was not confirmed")
    }
}

/// Transport trouble (the node may be restarting), as opposed to the chain
/// refusing the transaction.
fn transient(e: &ClientError) -> bool {
    match e.kind() {
        ErrorKind::Io(_) | ErrorKind::Reqwest(_) | ErrorKind::Middleware(_) => true,
        ErrorKind::RpcError(RpcError::RpcRequestError(_)) => true,
        ErrorKind::RpcError(RpcError::ForUser(m)) => m.contains("unable to confirm"),
        ErrorKind::RpcError(RpcError::RpcResponseError { data, code, .. }) => {
            !matches!(
                data,
                RpcResponseErrorData::SendTransactionPreflightFailure(_)
            ) && (*code == -32005 || *code == -32603)
        }
        _ => false,
    }
}

fn log_retry(what: &str, e: &anyhow::Error, wait: Duration) {
    eprintln!("{what}: {e}; retrying in {wait:?}");
}

/// A client error in one line (reqwest's chains are long).
fn short(e: &ClientError) -> String {
    match e.kind() {
        ErrorKind::Reqwest(r) if r.is_connect() => "connection refused".into(),
        ErrorKind::Reqwest(r) if r.is_timeout() => "timed out".into(),
        _ => e.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

/// A transaction the Cohort program refused, with the program's own error:
/// callers tell expected races (an epoch someone else already finalized)
/// from failures with [`refused_with`], not by matching text.
#[derive(Debug, Clone)]
pub struct Refused {
    pub what: String,
    pub error: CohortError,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} refused by the Cohort program: {}",
            self.what, self.error
        )
    }
}

impl std::error::Error for Refused {}

/// Whether `e` is the Cohort program refusing with `error`.
pub fn refused_with(e: &anyhow::Error, error: CohortError) -> bool {
    e.downcast_ref::<Refused>()
        .is_some_and(|r| r.error == error)
}

/// A refused transaction in the user's terms: Cohort's own errors by name.
pub fn explain(what: &str, e: &TransactionError) -> anyhow::Error {
    match e {
        TransactionError::InstructionError(_, InstructionError::Custom(code)) => {
            match CohortError::from_code(*code) {
                Some(error) => anyhow::Error::new(Refused {
                    what: what.to_string(),
                    error,
                }),
                None => anyhow!("{what} refused: custom error {code}"),
            }
        }
        TransactionError::InsufficientFundsForFee | TransactionError::AccountNotFound => {
            anyhow!("{what}: insufficient funds for the transaction fee")
        }
        TransactionError::InsufficientFundsForRent { .. } => {
            anyhow!("{what}: insufficient funds")
        }
        other => anyhow!("{what} refused: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_refusal_is_told_apart_by_its_error_and_still_reads_as_before() {
        let te = TransactionError::InstructionError(
            0,
            InstructionError::Custom(CohortError::EpochFinalized as u32),
        );
        let e = explain("attest_epoch", &te);
        assert!(refused_with(&e, CohortError::EpochFinalized));
        assert!(!refused_with(&e, CohortError::AlreadyVoted));
        assert_eq!(
            e.to_string(),
            "attest_epoch refused by the Cohort program: epoch is already finalized"
        );
        let other = explain("attest_epoch", &TransactionError::AccountNotFound);
        assert!(!refused_with(&other, CohortError::EpochFinalized));
    }
}
