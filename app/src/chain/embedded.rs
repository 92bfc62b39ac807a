//! The embedded chain: a real bank (solana-program-test) with the Cohort
//! program loaded as a builtin, answering Solana JSON-RPC. The same
//! [`Embedded::dispatch`] serves the in-process [`RpcSender`] (Sandbox, demo,
//! tests) and the HTTP server of `cohort localnet`, so every caller talks
//! to it through the stock `RpcClient`.

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use solana_commitment_config::CommitmentLevel;
use solana_program_test::{
    BanksClient, BanksClientError, ProgramTest, ProgramTestContext, processor,
};
use solana_rpc_client::nonblocking::rpc_client::RpcClient;
use solana_rpc_client::rpc_client::RpcClientConfig;
use solana_rpc_client::rpc_sender::{RpcSender, RpcTransportStats};
use solana_rpc_client_api::client_error::Result as ClientResult;
use solana_rpc_client_api::config::RpcProgramAccountsConfig;
use solana_rpc_client_api::custom_error::JSON_RPC_SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE;
use solana_rpc_client_api::filter::RpcFilterType;
use solana_rpc_client_api::request::{RpcError, RpcRequest, RpcResponseErrorData};
use solana_rpc_client_api::response::RpcSimulateTransactionResult;
use solana_sdk::account::Account;
use solana_sdk::clock::Clock;
use solana_sdk::hash::Hash;
use solana_sdk::message::{Message, VersionedMessage};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::{Keypair, Signature, Signer};
use solana_sdk::slot_hashes::SlotHashes;
use solana_sdk::transaction::{Transaction, TransactionError, VersionedTransaction};
use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The slot every answer reports: the bank stays in one slot (it is never
/// warped; see `start`), and clients only need it to be consistent.
const SLOT: u64 = 5;

/// A JSON-RPC error as the Solana RPC server reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcFailure {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcFailure {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: -32602,
            message: message.into(),
            data: None,
        }
    }
    fn internal(e: impl std::fmt::Display) -> Self {
        Self {
            code: -32603,
            message: format!("internal error: {e}"),
            data: None,
        }
    }
}

struct Inner {
    banks: BanksClient,
    /// Kept for `set_sysvar` (the wall clock) and alive for the bank's sake.
    ctx: ProgramTestContext,
    faucet: Keypair,
    /// Every address a transaction or airdrop touched: the bank cannot be
    /// scanned, and `getProgramAccounts` needs the program's accounts.
    known: Mutex<BTreeSet<Pubkey>>,
    statuses: Mutex<HashMap<Signature, (u64, Option<TransactionError>)>>,
    /// Every transaction that landed, oldest first, for
    /// `getSignaturesForAddress` (what an explorer reads).
    history: Mutex<Vec<Landed>>,
    requests: Mutex<RpcTransportStats>,
    /// The clock's slot and the `SlotHashes` entries before it, newest first.
    slots: Mutex<(u64, Vec<(u64, Hash)>)>,
}

/// A transaction that landed: its first signature, the addresses it named
/// and when.
struct Landed {
    sig: Signature,
    keys: Vec<Pubkey>,
    time: i64,
}

/// Cheap to clone: every clone is the same chain.
#[derive(Clone)]
pub struct Embedded {
    inner: Arc<Inner>,
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Embedded {
    /// Starts a fresh chain whose clock follows the wall clock.
    pub async fn start() -> Result<Self> {
        let mut pt = ProgramTest::default();
        pt.prefer_bpf(false);
        let builtin = processor!(cohort_program::processor::process_instruction)
            .ok_or_else(|| anyhow!("could not load the Cohort program as a builtin"))?;
        pt.add_builtin_program("cohort_program", cohort_program::ID, builtin);
        let ctx = pt.start_with_context().await;
        // Epoch committees are sealed from the hash of a slot after the
        // epoch's start. Warping the bank would make real slots, but races
        // the test bank's own blockhash task (it can find the frozen bank
        // mid-warp and panic), so the clock's slot and SlotHashes advance
        // by hand instead, one slot with a fresh random hash per tick.
        let faucet = ctx.payer.insecure_clone();
        let e = Self {
            inner: Arc::new(Inner {
                banks: ctx.banks_client.clone(),
                ctx,
                faucet,
                known: Mutex::new(BTreeSet::from([cohort_program::ID])),
                statuses: Mutex::new(HashMap::new()),
                history: Mutex::new(Vec::new()),
                requests: Mutex::new(RpcTransportStats::default()),
                slots: Mutex::new((SLOT, Vec::new())),
            }),
        };
        e.tick_clock();
        // Deadlines in the program are wall-clock seconds: keep the bank's
        // clock on time while anyone holds the chain.
        let weak = Arc::downgrade(&e.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Some(inner) = weak.upgrade() else { break };
                Embedded { inner }.tick_clock();
            }
        });
        Ok(e)
    }

    /// One slot on: the slot just ended gets a fresh random hash (the
    /// sysvar keeps the newest 512, as a validator's does).
    fn tick_clock(&self) {
        let Ok(mut g) = self.inner.slots.lock() else {
            return;
        };
        let (slot, hashes) = &mut *g;
        hashes.insert(
            0,
            (
                *slot,
                Hash::new_from_array(Keypair::new().pubkey().to_bytes()),
            ),
        );
        hashes.truncate(512);
        *slot += 1;
        self.inner.ctx.set_sysvar(&SlotHashes::new(hashes));
        self.inner.ctx.set_sysvar(&Clock {
            slot: *slot,
            unix_timestamp: self.now(),
            ..Default::default()
        });
    }

    /// The chain's clock, in Unix seconds.
    pub fn now(&self) -> i64 {
        now_unix()
    }

    /// A stock `RpcClient` over this chain, with no network in between.
    pub fn client(&self) -> RpcClient {
        RpcClient::new_sender(
            Sender(self.clone()),
            RpcClientConfig::with_commitment(
                solana_commitment_config::CommitmentConfig::confirmed(),
            ),
        )
    }

    pub fn faucet(&self) -> Pubkey {
        self.inner.faucet.pubkey()
    }

    /// Answers one JSON-RPC call.
    pub async fn dispatch(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        let p = |i: usize| params.get(i).cloned().unwrap_or(Value::Null);
        let banks = &self.inner.banks;
        let ctx = json!({ "slot": SLOT });
        let wrap = |v: Value| json!({ "context": ctx, "value": v });
        match method {
            "getHealth" => Ok(json!("ok")),
            "getVersion" => Ok(json!({ "solana-core": "4.2.2", "feature-set": null })),
            "getSlot" | "getBlockHeight" => Ok(json!(SLOT)),
            "getGenesisHash" => Ok(json!(
                banks
                    .get_latest_blockhash()
                    .await
                    .map_err(RpcFailure::internal)?
                    .to_string()
            )),
            "getEpochInfo" => Ok(json!({
                "epoch": 0, "slotIndex": SLOT, "slotsInEpoch": 432000,
                "absoluteSlot": SLOT, "blockHeight": SLOT, "transactionCount": null
            })),
            "getLatestBlockhash" => {
                let (hash, last) = banks
                    .get_latest_blockhash_with_commitment(CommitmentLevel::Confirmed)
                    .await
                    .map_err(RpcFailure::internal)?
                    .ok_or_else(|| RpcFailure::internal("no blockhash"))?;
                Ok(wrap(
                    json!({ "blockhash": hash.to_string(), "lastValidBlockHeight": last }),
                ))
            }
            "isBlockhashValid" => {
                let hash = parse::<Hash>(&p(0), "blockhash")?;
                let msg =
                    Message::new_with_blockhash(&[], Some(&self.inner.faucet.pubkey()), &hash);
                let fee = banks
                    .get_fee_for_message(msg)
                    .await
                    .map_err(RpcFailure::internal)?;
                Ok(wrap(json!(fee.is_some())))
            }
            "getFeeForMessage" => {
                let raw = b64(&p(0))?;
                let msg: VersionedMessage = bincode::deserialize(&raw)
                    .map_err(|e| RpcFailure::invalid(format!("invalid message: {e}")))?;
                let fee = match msg {
                    VersionedMessage::Legacy(m) => banks
                        .get_fee_for_message(m)
                        .await
                        .map_err(RpcFailure::internal)?,
                    VersionedMessage::V0(m) => Some(5000 * m.header.num_required_signatures as u64),
                    _ => None,
                };
                Ok(wrap(json!(fee)))
            }
            "getMinimumBalanceForRentExemption" => {
                let len = p(0)
                    .as_u64()
                    .ok_or_else(|| RpcFailure::invalid("expected a data length"))?;
                let rent = banks.get_rent().await.map_err(RpcFailure::internal)?;
                Ok(json!(rent.minimum_balance(len as usize)))
            }
            "getBalance" => {
                let k = parse::<Pubkey>(&p(0), "pubkey")?;
                Ok(wrap(json!(
                    banks.get_balance(k).await.map_err(RpcFailure::internal)?
                )))
            }
            "getAccountInfo" => {
                let k = parse::<Pubkey>(&p(0), "pubkey")?;
                let a = banks.get_account(k).await.map_err(RpcFailure::internal)?;
                Ok(wrap(a.map_or(Value::Null, |a| ui_account(&a))))
            }
            "getMultipleAccounts" => {
                let keys = p(0);
                let keys = keys
                    .as_array()
                    .ok_or_else(|| RpcFailure::invalid("expected a list of pubkeys"))?;
                let mut out = Vec::with_capacity(keys.len());
                for k in keys {
                    let k = parse::<Pubkey>(k, "pubkey")?;
                    let a = banks.get_account(k).await.map_err(RpcFailure::internal)?;
                    out.push(a.map_or(Value::Null, |a| ui_account(&a)));
                }
                Ok(wrap(Value::Array(out)))
            }
            "getProgramAccounts" => self.program_accounts(&p(0), p(1)).await,
            "getSignaturesForAddress" => self.signatures_for(&p(0), &p(1)),
            "getSignatureStatuses" => {
                let sigs = p(0);
                let sigs = sigs
                    .as_array()
                    .ok_or_else(|| RpcFailure::invalid("expected a list of signatures"))?;
                let statuses = self.inner.statuses.lock().map_err(RpcFailure::internal)?;
                let mut out = Vec::with_capacity(sigs.len());
                for s in sigs {
                    let s = parse::<Signature>(s, "signature")?;
                    out.push(match statuses.get(&s) {
                        None => Value::Null,
                        Some((slot, err)) => {
                            let status = match err {
                                None => json!({ "Ok": null }),
                                Some(e) => json!({ "Err": e }),
                            };
                            json!({
                                "slot": slot, "confirmations": null, "status": status,
                                "err": err, "confirmationStatus": "finalized"
                            })
                        }
                    });
                }
                Ok(wrap(Value::Array(out)))
            }
            "sendTransaction" => {
                let raw = b64(&p(0))?;
                let tx: VersionedTransaction = bincode::deserialize(&raw)
                    .map_err(|e| RpcFailure::invalid(format!("invalid transaction: {e}")))?;
                self.process(tx).await.map(|s| json!(s.to_string()))
            }
            "requestAirdrop" => {
                let to = parse::<Pubkey>(&p(0), "pubkey")?;
                let lamports = p(1)
                    .as_u64()
                    .ok_or_else(|| RpcFailure::invalid("expected lamports"))?;
                let faucet = &self.inner.faucet;
                let blockhash = banks
                    .get_latest_blockhash()
                    .await
                    .map_err(RpcFailure::internal)?;
                let ix =
                    solana_system_interface::instruction::transfer(&faucet.pubkey(), &to, lamports);
                let tx = Transaction::new_signed_with_payer(
                    &[ix],
                    Some(&faucet.pubkey()),
                    &[faucet],
                    blockhash,
                );
                self.process(tx.into()).await.map(|s| json!(s.to_string()))
            }
            other => Err(RpcFailure {
                code: -32601,
                message: format!("Method not found: {other}"),
                data: None,
            }),
        }
    }

    /// Runs a transaction with preflight, as a validator's RPC would:
    /// a failing one is refused (no fee, no state) with its logs.
    async fn process(&self, tx: VersionedTransaction) -> Result<Signature, RpcFailure> {
        let sig = *tx
            .signatures
            .first()
            .ok_or_else(|| RpcFailure::invalid("transaction has no signature"))?;
        if let Ok(s) = self.inner.statuses.lock()
            && s.contains_key(&sig)
        {
            // The same signed transaction again: report it, never rerun it.
            return Ok(sig);
        }
        let keys: Vec<Pubkey> = tx.message.static_account_keys().to_vec();
        let r = self
            .inner
            .banks
            .process_transaction_with_preflight_and_commitment(tx, CommitmentLevel::Confirmed)
            .await;
        match r {
            Ok(()) => {
                if let Ok(mut h) = self.inner.history.lock() {
                    h.push(Landed {
                        sig,
                        keys: keys.clone(),
                        time: now_unix(),
                    });
                }
                if let Ok(mut k) = self.inner.known.lock() {
                    k.extend(keys);
                }
                if let Ok(mut s) = self.inner.statuses.lock() {
                    s.insert(sig, (SLOT, None));
                }
                Ok(sig)
            }
            Err(BanksClientError::SimulationError {
                err,
                logs,
                units_consumed,
                ..
            }) => Err(preflight_failure(&err, logs, units_consumed)),
            Err(BanksClientError::TransactionError(err)) => Err(preflight_failure(&err, vec![], 0)),
            Err(e) => Err(RpcFailure::internal(e)),
        }
    }

    /// Newest first, as a validator answers: at most `limit` (≤ 1,000)
    /// signatures of landed transactions naming `address`, older than
    /// `before` and newer than `until` when given.
    fn signatures_for(&self, address: &Value, config: &Value) -> Result<Value, RpcFailure> {
        let k = parse::<Pubkey>(address, "address")?;
        let limit = config.get("limit").and_then(Value::as_u64).unwrap_or(1000);
        if !(1..=1000).contains(&limit) {
            return Err(RpcFailure::invalid(format!(
                "Invalid limit; max 1000, got {limit}"
            )));
        }
        let sig = |key: &str| {
            config
                .get(key)
                .filter(|v| !v.is_null())
                .map(|v| parse::<Signature>(v, key))
                .transpose()
        };
        let (before, until) = (sig("before")?, sig("until")?);
        let history = self.inner.history.lock().map_err(RpcFailure::internal)?;
        let mut newest_first = history.iter().rev();
        if let Some(b) = before {
            // Past `before` itself; nothing when it never landed.
            if newest_first.by_ref().all(|l| l.sig != b) {
                return Ok(json!([]));
            }
        }
        let out: Vec<Value> = newest_first
            .take_while(|l| Some(l.sig) != until)
            .filter(|l| l.keys.contains(&k))
            .take(limit as usize)
            .map(|l| {
                json!({
                    "signature": l.sig.to_string(), "slot": SLOT, "err": null,
                    "memo": null, "blockTime": l.time, "confirmationStatus": "finalized"
                })
            })
            .collect();
        Ok(Value::Array(out))
    }

    async fn program_accounts(&self, program: &Value, config: Value) -> Result<Value, RpcFailure> {
        let program = parse::<Pubkey>(program, "program id")?;
        let config: RpcProgramAccountsConfig = if config.is_null() {
            RpcProgramAccountsConfig::default()
        } else {
            serde_json::from_value(config)
                .map_err(|e| RpcFailure::invalid(format!("invalid config: {e}")))?
        };
        let known: Vec<Pubkey> = self
            .inner
            .known
            .lock()
            .map_err(RpcFailure::internal)?
            .iter()
            .copied()
            .collect();
        let mut out = Vec::new();
        for k in known {
            let Some(a) = self
                .inner
                .banks
                .get_account(k)
                .await
                .map_err(RpcFailure::internal)?
            else {
                continue;
            };
            let keep = a.owner == program
                && config.filters.iter().flatten().all(|f| match f {
                    RpcFilterType::DataSize(n) => a.data.len() as u64 == *n,
                    RpcFilterType::Memcmp(m) => m.bytes_match(&a.data),
                    _ => false,
                });
            if keep {
                out.push(json!({ "pubkey": k.to_string(), "account": ui_account(&a) }));
            }
        }
        if config.with_context == Some(true) {
            Ok(json!({ "context": { "slot": SLOT }, "value": out }))
        } else {
            Ok(Value::Array(out))
        }
    }
}

fn preflight_failure(err: &TransactionError, logs: Vec<String>, units: u64) -> RpcFailure {
    RpcFailure {
        code: JSON_RPC_SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE,
        message: format!("Transaction simulation failed: {err}"),
        data: Some(json!({ "err": err, "logs": logs, "unitsConsumed": units })),
    }
}

fn ui_account(a: &Account) -> Value {
    json!({
        "lamports": a.lamports,
        "data": [B64.encode(&a.data), "base64"],
        "owner": a.owner.to_string(),
        "executable": a.executable,
        "rentEpoch": a.rent_epoch,
        "space": a.data.len(),
    })
}

fn parse<T: FromStr>(v: &Value, what: &str) -> Result<T, RpcFailure> {
    v.as_str()
        .and_then(|s| T::from_str(s).ok())
        .ok_or_else(|| RpcFailure::invalid(format!("Invalid param: not a valid {what}")))
}

fn b64(v: &Value) -> Result<Vec<u8>, RpcFailure> {
    v.as_str()
        .and_then(|s| B64.decode(s).ok())
        .ok_or_else(|| RpcFailure::invalid("Invalid param: not base64"))
}

/// `RpcSender` straight into the bank: what `RpcClient::new_sender` drives.
struct Sender(Embedded);

#[async_trait]
impl RpcSender for Sender {
    async fn send(&self, request: RpcRequest, params: Value) -> ClientResult<Value> {
        if let Ok(mut s) = self.0.inner.requests.lock() {
            s.request_count += 1;
        }
        let method = request.to_string();
        self.0.dispatch(&method, params).await.map_err(|f| {
            let data = match (f.code, f.data) {
                (JSON_RPC_SERVER_ERROR_SEND_TRANSACTION_PREFLIGHT_FAILURE, Some(d)) => {
                    serde_json::from_value::<RpcSimulateTransactionResult>(d).map_or(
                        RpcResponseErrorData::Empty,
                        RpcResponseErrorData::SendTransactionPreflightFailure,
                    )
                }
                _ => RpcResponseErrorData::Empty,
            };
            RpcError::RpcResponseError {
                code: f.code,
                message: f.message,
                data,
            }
            .into()
        })
    }

    fn get_transport_stats(&self) -> RpcTransportStats {
        self.0
            .inner
            .requests
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    fn url(&self) -> String {
        "embedded".into()
    }
}
