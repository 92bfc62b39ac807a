//! Test harness: the Cohort program as a builtin inside a real bank, with
//! lamport bookkeeping so every test can assert conservation after each
//! transaction.
#![allow(dead_code)]

use cohort_program::client;
use cohort_program::error::CohortError;
use cohort_program::instruction::NodeTerms;
use cohort_program::merkle::MerkleTree;
use cohort_program::schedule::SEAL_DELAY_SLOTS;
use cohort_program::state::*;
use solana_program_test::{BanksClientError, ProgramTest, ProgramTestContext, processor};
use solana_sdk::account::Account;
use solana_sdk::clock::Clock;
use solana_sdk::hash::Hash;
use solana_sdk::instruction::{Instruction, InstructionError};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::rent::Rent;
use solana_sdk::signature::{Keypair, Signer};
use solana_sdk::slot_hashes::SlotHashes;
use solana_sdk::transaction::{Transaction, TransactionError};
use std::collections::BTreeSet;

pub const SOL: u64 = 1_000_000_000;
pub const PRICE: u64 = 1_000_000;
pub const STAKE: u64 = 5_000_000;
pub const T0: i64 = 1_800_000_000;

pub fn spec() -> JobSpec {
    let mut s = JobSpec {
        model_hash: [7; 32],
        arch: [0; 64],
        recipe_hash: [3; 32],
        dataset_id: [9; 32],
        global_batch: 32,
        seq_len: 128,
        steps_per_epoch: 10,
        epochs: 3,
        expected_epoch_secs: 600,
        max_epoch_secs: 3600,
        join_window_secs: 3600,
        min_nodes: 3,
        max_nodes: 4,
        min_fp32_gflops: 1_000,
        max_price: PRICE,
        min_stake: STAKE,
        witness_count: 3,
        quorum: 2,
        audit_rate_bp: 200,
    };
    s.set_arch("gpt l2 d64 h4 s128");
    s
}

pub fn terms(price: u64, gflops: u32) -> NodeTerms {
    let mut b = Benchmark {
        backend: Backend::Cpu as u8,
        fp32_gflops: gflops,
        fp16_gflops: gflops * 2,
        mem_bw_gbps: 50,
        vram_mib: 8192,
        version: 1,
        ..Default::default()
    };
    b.set_device_name("test-gpu");
    NodeTerms {
        price,
        available_from: 0,
        available_until: i64::MAX,
        benchmark: b,
    }
}

pub struct Env {
    pub ctx: ProgramTestContext,
    pub rent: Rent,
    tracked: BTreeSet<Pubkey>,
    initial: u64,
    pub fees: u64,
    /// Lamports sent to the incinerator (slashed stake, unclaimed pay).
    pub burned: u64,
    pub now: i64,
    /// The bank's clock slot as the program sees it, and the `SlotHashes`
    /// entries (newest first) for every slot before it.
    pub slot: u64,
    pub hashes: Vec<(u64, Hash)>,
}

/// The runtime burns whatever this address holds.
pub const INCINERATOR: Pubkey = solana_program::incinerator::ID;

pub fn program_test() -> ProgramTest {
    let mut pt = ProgramTest::default();
    pt.prefer_bpf(false);
    pt.add_builtin_program(
        "cohort_program",
        cohort_program::ID,
        processor!(cohort_program::processor::process_instruction).unwrap(),
    );
    pt
}

impl Env {
    pub async fn new() -> Self {
        let mut ctx = program_test().start_with_context().await;
        // The warp makes the bank's slot 5; the clock and SlotHashes are
        // then set by the harness (`advance_slots`).
        ctx.warp_to_slot(5).unwrap();
        let rent = ctx.banks_client.get_rent().await.unwrap();
        let mut env = Self {
            ctx,
            rent,
            tracked: BTreeSet::new(),
            initial: 0,
            fees: 0,
            burned: 0,
            now: T0,
            slot: 5,
            hashes: Vec::new(),
        };
        env.set_slot_hashes(&[]);
        env.advance_slots(1);
        env.set_time(T0);
        let payer = env.ctx.payer.pubkey();
        env.track(payer);
        env.initial = env.total().await;
        env
    }

    pub fn set_time(&mut self, t: i64) {
        let mut clock: Clock = Clock {
            slot: self.slot,
            unix_timestamp: t,
            ..Default::default()
        };
        clock.epoch_start_timestamp = t;
        self.ctx.set_sysvar(&clock);
        self.now = t;
    }

    pub fn advance(&mut self, secs: i64) {
        self.set_time(self.now + secs);
    }

    /// Moves the clock `n` slots on; each slot passed gets a fresh random
    /// hash (no one, the test included, can predict it).
    pub fn advance_slots(&mut self, n: u64) {
        for _ in 0..n {
            let h = Hash::new_from_array(Keypair::new().pubkey().to_bytes());
            self.hashes.insert(0, (self.slot, h));
            self.slot += 1;
        }
        self.hashes.truncate(512);
        let entries = self.hashes.clone();
        self.set_slot_hashes(&entries);
        self.set_time(self.now);
    }

    pub fn set_slot_hashes(&mut self, entries: &[(u64, Hash)]) {
        self.hashes = entries.to_vec();
        self.ctx.set_sysvar(&SlotHashes::new(entries));
    }

    /// The raw `SlotHashes` data, as a client reads it.
    pub async fn slot_hashes_data(&mut self) -> Vec<u8> {
        self.account(&solana_sdk::sysvar::slot_hashes::ID)
            .await
            .expect("slot hashes")
            .data
    }

    pub fn track(&mut self, k: Pubkey) {
        self.tracked.insert(k);
    }

    pub async fn total(&mut self) -> u64 {
        let mut sum = 0;
        for k in self.tracked.clone() {
            sum += self.balance(&k).await;
        }
        sum
    }

    pub async fn balance(&mut self, k: &Pubkey) -> u64 {
        self.ctx.banks_client.get_balance(*k).await.unwrap()
    }

    pub async fn account(&mut self, k: &Pubkey) -> Option<Account> {
        self.ctx.banks_client.get_account(*k).await.unwrap()
    }

    pub async fn state<T: AccountState>(&mut self, k: &Pubkey) -> T {
        let acc = self.account(k).await.expect("account exists");
        assert_eq!(acc.owner, cohort_program::ID);
        T::decode(&acc.data).expect("decodes")
    }

    /// A funded keypair, tracked for conservation.
    pub async fn user(&mut self, lamports: u64) -> Keypair {
        let k = Keypair::new();
        self.track(k.pubkey());
        self.track(client::node_address(&k.pubkey()));
        self.track(client::requester_address(&k.pubkey()));
        self.fund(&k.pubkey(), lamports).await;
        k
    }

    pub async fn fund(&mut self, to: &Pubkey, lamports: u64) {
        let payer = self.ctx.payer.insecure_clone();
        let ix = solana_system_interface::instruction::transfer(&payer.pubkey(), to, lamports);
        self.send(&[ix], &[]).await.unwrap();
    }

    /// Sends one transaction paid by the context payer and checks lamport
    /// conservation and rent exemption of every tracked program account.
    pub async fn send(
        &mut self,
        ixs: &[Instruction],
        signers: &[&Keypair],
    ) -> Result<(), BanksClientError> {
        let payer = self.ctx.payer.insecure_clone();
        let mut all: Vec<&Keypair> = vec![&payer];
        all.extend_from_slice(signers);
        let blockhash = self.ctx.get_new_latest_blockhash().await.unwrap();
        let tx = Transaction::new_signed_with_payer(ixs, Some(&payer.pubkey()), &all, blockhash);
        let fee = self
            .ctx
            .banks_client
            .get_fee_for_message(tx.message.clone())
            .await
            .unwrap()
            .unwrap_or(0);
        let incinerated = self.balance(&INCINERATOR).await;
        let res = self.ctx.banks_client.process_transaction(tx).await;
        self.burned += self.balance(&INCINERATOR).await - incinerated;
        let charged = match &res {
            Ok(()) => true,
            Err(BanksClientError::TransactionError(TransactionError::InstructionError(..))) => true,
            Err(_) => false,
        };
        if charged {
            self.fees += fee;
        }
        self.check_invariants().await;
        res
    }

    pub async fn check_invariants(&mut self) {
        let total = self.total().await;
        assert_eq!(
            total + self.fees + self.burned,
            self.initial,
            "lamports created or lost"
        );
        for k in self.tracked.clone() {
            if let Some(acc) = self.account(&k).await
                && acc.owner == cohort_program::ID
            {
                assert!(
                    self.rent.is_exempt(acc.lamports, acc.data.len()),
                    "{k} fell below rent exemption"
                );
            }
        }
    }

    pub async fn register(
        &mut self,
        node: &Keypair,
        price: u64,
        gflops: u32,
        stake: u64,
    ) -> Result<(), BanksClientError> {
        let ix = client::register_node(&node.pubkey(), terms(price, gflops), stake);
        self.send(&[ix], &[node]).await
    }

    /// `n` funded, registered nodes at the default price, benchmark and stake.
    pub async fn nodes(&mut self, n: usize) -> Vec<Keypair> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.user(SOL).await;
            self.register(&k, PRICE, 5_000, STAKE).await.unwrap();
            out.push(k);
        }
        out
    }

    pub async fn create_job(
        &mut self,
        requester: &Keypair,
        id: u64,
        spec: JobSpec,
        deposit: u64,
    ) -> Result<Pubkey, BanksClientError> {
        let job = client::job_address(&requester.pubkey(), id);
        self.track(job);
        for e in 0..spec.epochs.min(64) {
            self.track(client::epoch_address(&job, e));
        }
        let ix = client::create_job(&requester.pubkey(), id, spec, deposit);
        self.send(&[ix], &[requester]).await.map(|_| job)
    }

    pub async fn join(&mut self, node: &Keypair, job: &Pubkey) -> Result<(), BanksClientError> {
        self.track(client::member_address(job, &node.pubkey()));
        self.send(&[client::join_job(&node.pubkey(), job)], &[node])
            .await
    }

    /// Starts the next epoch, lets its seal slot pass and seals it.
    pub async fn start_epoch(&mut self, job: &Pubkey) -> Result<u32, BanksClientError> {
        let e = self.start_unsealed(job).await?;
        self.advance_slots(SEAL_DELAY_SLOTS + 1);
        self.seal(job, e).await?;
        Ok(e)
    }

    pub async fn start_unsealed(&mut self, job: &Pubkey) -> Result<u32, BanksClientError> {
        let j: Job = self.state(job).await;
        let payer = self.ctx.payer.pubkey();
        self.send(&[client::start_epoch(&payer, job, j.epochs_started)], &[])
            .await?;
        Ok(j.epochs_started)
    }

    /// Seals epoch `e` as an honest client would: the committee drawn from
    /// the seal slot's hash, each seat's active member named.
    pub async fn seal(&mut self, job: &Pubkey, e: u32) -> Result<(), BanksClientError> {
        let ix = self.seal_ix(job, e).await;
        self.send(&[ix], &[]).await
    }

    pub async fn seal_ix(&mut self, job: &Pubkey, e: u32) -> Instruction {
        let j: Job = self.state(job).await;
        let epoch: Epoch = self.state(&client::epoch_address(job, e)).await;
        let data = self.slot_hashes_data().await;
        let seats = client::committee_to_seal(&data, job, &j, &epoch).expect("seal slot hashed");
        let by_index = self.active_members(job).await;
        let owners: Vec<Pubkey> = seats
            .iter()
            .map(|i| by_index[*i as usize].expect("a member at every drawn index"))
            .collect();
        client::seal_epoch(job, e, &owners)
    }

    /// Every tracked active member of `job`, by index.
    pub async fn active_members(&mut self, job: &Pubkey) -> Vec<Option<Pubkey>> {
        let j: Job = self.state(job).await;
        let mut out = vec![None; j.member_count as usize];
        for k in self.tracked.clone() {
            if let Some(acc) = self.account(&k).await
                && acc.owner == cohort_program::ID
                && let Ok(m) = Member::decode(&acc.data)
                && m.job == *job
                && m.status == MemberStatus::Active
                && (m.index as usize) < out.len()
            {
                out[m.index as usize] = Some(m.node);
            }
        }
        out
    }

    /// Owners of the active members of `job`, by index, among `candidates`.
    pub async fn members_by_index(
        &mut self,
        job: &Pubkey,
        candidates: &[&Keypair],
    ) -> Vec<Option<Pubkey>> {
        let j: Job = self.state(job).await;
        let mut out = vec![None; j.member_count as usize];
        for c in candidates {
            let addr = client::member_address(job, &c.pubkey());
            if let Some(acc) = self.account(&addr).await
                && let Ok(m) = Member::decode(&acc.data)
                && m.status == MemberStatus::Active
                && (m.index as usize) < out.len()
            {
                out[m.index as usize] = Some(c.pubkey());
            }
        }
        out
    }

    /// The witnesses of `epoch`, in seat order (empty seats left out).
    pub async fn witnesses(
        &mut self,
        job: &Pubkey,
        epoch: u32,
        _candidates: &[&Keypair],
    ) -> Vec<Pubkey> {
        let e: Epoch = self.state(&client::epoch_address(job, epoch)).await;
        e.seated().map(|(_, k)| *k).collect()
    }
}

/// The contribution tree witnesses build: cumulative points per node, sorted by key.
pub fn tree(points: &[(Pubkey, u64)]) -> MerkleTree {
    let mut v = points.to_vec();
    v.sort();
    MerkleTree::new(&v).unwrap()
}

pub fn proof_for(points: &[(Pubkey, u64)], who: &Pubkey) -> (u64, Vec<[u8; 32]>) {
    let mut v = points.to_vec();
    v.sort();
    let t = MerkleTree::new(&v).unwrap();
    let i = v.iter().position(|(k, _)| k == who).unwrap();
    (v[i].1, t.proof(i).unwrap())
}

pub fn find<'a>(keys: &'a [Keypair], k: &Pubkey) -> &'a Keypair {
    keys.iter().find(|x| x.pubkey() == *k).unwrap()
}

/// Asserts the transaction failed with exactly this Cohort error.
#[track_caller]
pub fn assert_err(res: Result<(), BanksClientError>, want: CohortError) {
    match res {
        Err(BanksClientError::TransactionError(TransactionError::InstructionError(
            _,
            InstructionError::Custom(code),
        ))) => {
            assert_eq!(CohortError::from_code(code), Some(want), "got code {code}");
        }
        other => panic!("expected {want:?}, got {other:?}"),
    }
}
