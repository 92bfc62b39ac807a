//! Instruction handlers. Every handler checks signers, writability, owners,
//! discriminators and PDA addresses of the accounts it touches before reading
//! them, and does all arithmetic checked.

use crate::error::CohortError;
use crate::instruction::{CohortInstruction, NodeTerms};
use crate::merkle::{self, Hash32};
use crate::pda;
use crate::schedule::{SEAL_DELAY_SLOTS, SealHash, seal_committee, seal_hash};
use crate::state::*;
use solana_program::account_info::{AccountInfo, next_account_info};
use solana_program::clock::Clock;
use solana_program::entrypoint::ProgramResult;
use solana_program::incinerator;
use solana_program::msg;
use solana_program::program::invoke_signed;
use solana_program::program_error::ProgramError;
use solana_program::pubkey::Pubkey;
use solana_program::rent::Rent;
use solana_program::sysvar::{self, SysvarSerialize};
use solana_system_interface::instruction as system_instruction;
use solana_system_interface::program as system_program;

type Res<T> = Result<T, ProgramError>;

pub fn process_instruction(
    program_id: &Pubkey,
    accounts: &[AccountInfo],
    data: &[u8],
) -> ProgramResult {
    let ix = CohortInstruction::unpack(data).map_err(CohortError::from)?;
    let ctx = Ctx {
        program_id,
        accounts,
    };
    match ix {
        CohortInstruction::RegisterNode { terms, stake } => ctx.register_node(terms, stake),
        CohortInstruction::UpdateNode { terms, add_stake } => ctx.update_node(terms, add_stake),
        CohortInstruction::DeregisterNode => ctx.deregister_node(),
        CohortInstruction::CloseNode => ctx.close_node(),
        CohortInstruction::CreateJob {
            job_id,
            spec,
            deposit,
        } => ctx.create_job(job_id, spec, deposit),
        CohortInstruction::JoinJob => ctx.join_job(),
        CohortInstruction::LeaveJob => ctx.leave_job(),
        CohortInstruction::StartEpoch => ctx.start_epoch(),
        CohortInstruction::AttestEpoch {
            epoch,
            model_hash,
            root,
            total_points,
        } => ctx.attest_epoch(epoch, model_hash, root, total_points),
        CohortInstruction::Claim { points, proof } => ctx.claim(points, &proof),
        CohortInstruction::ReportFraud { epoch, evidence } => ctx.report_fraud(epoch, evidence),
        CohortInstruction::CancelJob => ctx.cancel_job(),
        CohortInstruction::ExpireJob => ctx.expire_job(),
        CohortInstruction::CloseMember { points, proof } => ctx.close_member(points, &proof),
        CohortInstruction::CloseEpoch => ctx.close_epoch(),
        CohortInstruction::CloseJob => ctx.close_job(),
        CohortInstruction::Withdraw => ctx.withdraw(),
        CohortInstruction::CloseFraudCase => ctx.close_fraud_case(),
        CohortInstruction::SealEpoch => ctx.seal_epoch(),
        CohortInstruction::SkipEpoch => ctx.skip_epoch(),
    }
}

fn err(e: CohortError) -> ProgramError {
    e.into()
}

fn signer(ai: &AccountInfo) -> Res<()> {
    if ai.is_signer {
        Ok(())
    } else {
        Err(err(CohortError::MissingSigner))
    }
}

fn writable(ai: &AccountInfo) -> Res<()> {
    if ai.is_writable {
        Ok(())
    } else {
        Err(err(CohortError::NotWritable))
    }
}

fn same(a: &Pubkey, b: &Pubkey, e: CohortError) -> Res<()> {
    if a == b { Ok(()) } else { Err(err(e)) }
}

fn add(a: u64, b: u64) -> Res<u64> {
    a.checked_add(b).ok_or(err(CohortError::Overflow))
}

fn sub(a: u64, b: u64) -> Res<u64> {
    a.checked_sub(b).ok_or(err(CohortError::Overflow))
}

fn clock(ai: &AccountInfo) -> Res<Clock> {
    same(ai.key, &sysvar::clock::ID, CohortError::WrongSysvar)?;
    Clock::from_account_info(ai).map_err(|_| err(CohortError::WrongSysvar))
}

fn rent(ai: &AccountInfo) -> Res<Rent> {
    same(ai.key, &sysvar::rent::ID, CohortError::WrongSysvar)?;
    Rent::from_account_info(ai).map_err(|_| err(CohortError::WrongSysvar))
}

/// The `SlotHashes` sysvar's raw data, checked to be that sysvar.
fn slot_hashes<'a>(ai: &'a AccountInfo) -> Res<std::cell::Ref<'a, &'a mut [u8]>> {
    same(ai.key, &sysvar::slot_hashes::ID, CohortError::WrongSysvar)?;
    ai.try_borrow_data()
}

fn load<T: AccountState>(ai: &AccountInfo, program_id: &Pubkey) -> Res<T> {
    if ai.owner != program_id {
        return Err(err(CohortError::WrongOwner));
    }
    Ok(T::decode(&ai.try_borrow_data()?)?)
}

fn store<T: AccountState>(ai: &AccountInfo, value: &T) -> Res<()> {
    writable(ai)?;
    let bytes = value.encode();
    let mut data = ai.try_borrow_mut_data()?;
    if data.len() != bytes.len() {
        return Err(err(CohortError::WrongAccountType));
    }
    data.copy_from_slice(&bytes);
    Ok(())
}

fn move_lamports(from: &AccountInfo, to: &AccountInfo, amount: u64) -> Res<()> {
    if amount == 0 {
        return Ok(());
    }
    writable(from)?;
    writable(to)?;
    let new_from = from
        .lamports()
        .checked_sub(amount)
        .ok_or(err(CohortError::InsufficientFunds))?;
    let new_to = add(to.lamports(), amount)?;
    **from.try_borrow_mut_lamports()? = new_from;
    **to.try_borrow_mut_lamports()? = new_to;
    Ok(())
}

/// Drains a program account into `dest` and hands it back to the system
/// program with no data, so it can be neither read as state nor revived.
fn close_account(ai: &AccountInfo, dest: &AccountInfo) -> Res<()> {
    move_lamports(ai, dest, ai.lamports())?;
    ai.try_borrow_mut_data()?.fill(0);
    ai.resize(0)?;
    ai.assign(&system_program::ID);
    Ok(())
}

fn check_system_program(ai: &AccountInfo) -> Res<()> {
    same(ai.key, &system_program::ID, CohortError::WrongSystemProgram)
}

/// Where burned lamports go: the runtime destroys whatever this address holds.
fn incinerator(ai: &AccountInfo) -> Res<()> {
    same(ai.key, &incinerator::ID, CohortError::AccountMismatch)
}

/// "Closed" means "not owned by this program": lamports anyone sends to a
/// closed address never make it look open again.
fn is_closed(ai: &AccountInfo, program_id: &Pubkey) -> bool {
    ai.owner != program_id
}

/// One method per instruction, each `#[inline(never)]` so every handler
/// gets its own SBF stack frame (4 KiB) instead of sharing the dispatcher's.
struct Ctx<'a, 'b> {
    program_id: &'a Pubkey,
    accounts: &'a [AccountInfo<'b>],
}

impl<'a, 'b> Ctx<'a, 'b> {
    /// Creates the PDA `ai` (which must be fresh) owned by this program with
    /// `extra` lamports on top of rent exemption, paid by `payer`.
    #[allow(clippy::too_many_arguments)]
    fn create_pda(
        &self,
        payer: &AccountInfo<'b>,
        ai: &AccountInfo<'b>,
        system: &AccountInfo<'b>,
        rent: &Rent,
        seeds: &[&[u8]],
        space: usize,
        extra: u64,
    ) -> Res<()> {
        writable(ai)?;
        if ai.owner == self.program_id {
            return Err(err(CohortError::AlreadyInitialized));
        }
        let needed = add(rent.minimum_balance(space), extra)?;
        if payer.lamports() < needed.saturating_sub(ai.lamports()) {
            return Err(err(CohortError::InsufficientFunds));
        }
        let accounts = [payer.clone(), ai.clone(), system.clone()];
        if ai.lamports() == 0 {
            let ix = system_instruction::create_account(
                payer.key,
                ai.key,
                needed,
                space as u64,
                self.program_id,
            );
            invoke_signed(&ix, &accounts, &[seeds])?;
        } else {
            // Someone pre-funded the address to block `create_account`: top up,
            // then allocate and assign, which work on a funded account.
            let top_up = needed.saturating_sub(ai.lamports());
            if top_up > 0 {
                invoke_signed(
                    &system_instruction::transfer(payer.key, ai.key, top_up),
                    &accounts,
                    &[],
                )?;
            }
            invoke_signed(
                &system_instruction::allocate(ai.key, space as u64),
                &accounts,
                &[seeds],
            )?;
            invoke_signed(
                &system_instruction::assign(ai.key, self.program_id),
                &accounts,
                &[seeds],
            )?;
        }
        Ok(())
    }

    /// The requester's id counter, created (rent paid by the requester) on
    /// its first job. Never closed.
    fn requester_at(
        &self,
        ai: &AccountInfo<'b>,
        requester: &AccountInfo<'b>,
        system: &AccountInfo<'b>,
        rent: &Rent,
    ) -> Res<Requester> {
        let (addr, bump) = pda::requester(self.program_id, requester.key);
        same(ai.key, &addr, CohortError::InvalidPda)?;
        if ai.owner == self.program_id {
            let ids: Requester = load(ai, self.program_id)?;
            same(&ids.requester, requester.key, CohortError::AccountMismatch)?;
            return Ok(ids);
        }
        self.create_pda(
            requester,
            ai,
            system,
            rent,
            &[pda::REQUESTER_SEED, requester.key.as_ref(), &[bump]],
            Requester::LEN,
            0,
        )?;
        Ok(Requester {
            bump,
            requester: *requester.key,
            next_job_id: 0,
        })
    }

    /// The votes against `accused` for `epoch`, opened (rent paid by
    /// `payer`) by the first report.
    #[allow(clippy::too_many_arguments)]
    fn fraud_case_at(
        &self,
        ai: &AccountInfo<'b>,
        payer: &AccountInfo<'b>,
        system: &AccountInfo<'b>,
        rent: &Rent,
        job: &Pubkey,
        accused: &Pubkey,
        epoch: u32,
        evidence: Hash32,
    ) -> Res<Box<FraudCase>> {
        let (addr, bump) = pda::fraud_case(self.program_id, job, accused, epoch);
        same(ai.key, &addr, CohortError::InvalidPda)?;
        if ai.owner == self.program_id {
            let case: FraudCase = load(ai, self.program_id)?;
            let mine = case.job == *job && case.accused == *accused && case.epoch == epoch;
            if !mine {
                return Err(err(CohortError::AccountMismatch));
            }
            return Ok(Box::new(case));
        }
        signer(payer)?;
        self.create_pda(
            payer,
            ai,
            system,
            rent,
            &[
                pda::FRAUD_SEED,
                job.as_ref(),
                accused.as_ref(),
                &epoch.to_le_bytes(),
                &[bump],
            ],
            FraudCase::LEN,
            0,
        )?;
        Ok(Box::new(FraudCase {
            bump,
            job: *job,
            accused: *accused,
            epoch,
            rent_payer: *payer.key,
            votes: 0,
            voters: [Pubkey::default(); MAX_WITNESSES],
            evidence,
            slashed: false,
        }))
    }

    fn node_at(&self, ai: &AccountInfo, owner: &Pubkey) -> Res<Node> {
        let node: Node = load(ai, self.program_id)?;
        same(&node.owner, owner, CohortError::AccountMismatch)?;
        let addr = Pubkey::create_program_address(
            &[pda::NODE_SEED, owner.as_ref(), &[node.bump]],
            self.program_id,
        )
        .map_err(|_| err(CohortError::InvalidPda))?;
        same(ai.key, &addr, CohortError::InvalidPda)?;
        Ok(node)
    }

    fn job_at(&self, ai: &AccountInfo) -> Res<Job> {
        let job: Job = load(ai, self.program_id)?;
        let addr = Pubkey::create_program_address(
            &[
                pda::JOB_SEED,
                job.requester.as_ref(),
                &job.job_id.to_le_bytes(),
                &[job.bump],
            ],
            self.program_id,
        )
        .map_err(|_| err(CohortError::InvalidPda))?;
        same(ai.key, &addr, CohortError::InvalidPda)?;
        Ok(job)
    }

    /// A `Member` of exactly this job: a member of another job is `AccountMismatch`.
    fn member_at(&self, ai: &AccountInfo, job: &Pubkey) -> Res<Member> {
        let m: Member = load(ai, self.program_id)?;
        same(&m.job, job, CohortError::AccountMismatch)?;
        let addr = Pubkey::create_program_address(
            &[pda::MEMBER_SEED, job.as_ref(), m.node.as_ref(), &[m.bump]],
            self.program_id,
        )
        .map_err(|_| err(CohortError::InvalidPda))?;
        same(ai.key, &addr, CohortError::InvalidPda)?;
        Ok(m)
    }

    /// Boxed, and its seat and vote arrays boxed inside: an Epoch's 1.3 KB
    /// must not sit in a 4 KiB SBF frame.
    fn epoch_at(&self, ai: &AccountInfo, job: &Pubkey) -> Res<Box<Epoch>> {
        let e: Box<Epoch> = Box::new(load(ai, self.program_id)?);
        same(&e.job, job, CohortError::AccountMismatch)?;
        let addr = Pubkey::create_program_address(
            &[
                pda::EPOCH_SEED,
                job.as_ref(),
                &e.index.to_le_bytes(),
                &[e.bump],
            ],
            self.program_id,
        )
        .map_err(|_| err(CohortError::InvalidPda))?;
        same(ai.key, &addr, CohortError::InvalidPda)?;
        Ok(e)
    }

    #[inline(never)]
    fn register_node(&self, terms: NodeTerms, stake: u64) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let system = next_account_info(it)?;
        let rent = rent(next_account_info(it)?)?;
        signer(owner)?;
        check_system_program(system)?;
        if terms.available_from > terms.available_until {
            return Err(err(CohortError::InvalidInstruction));
        }
        let (addr, bump) = pda::node(self.program_id, owner.key);
        same(node_ai.key, &addr, CohortError::InvalidPda)?;
        self.create_pda(
            owner,
            node_ai,
            system,
            &rent,
            &[pda::NODE_SEED, owner.key.as_ref(), &[bump]],
            Node::LEN,
            stake,
        )?;
        let node = Node {
            bump,
            owner: *owner.key,
            stake,
            price: terms.price,
            available_from: terms.available_from,
            available_until: terms.available_until,
            benchmark: terms.benchmark,
            status: NodeStatus::Active,
            unlock_at: 0,
            epochs_attested: 0,
            audits_failed: 0,
            slashes: 0,
            active_job: Pubkey::default(),
        };
        store(node_ai, &node)
    }

    #[inline(never)]
    fn update_node(&self, terms: NodeTerms, add_stake: u64) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let system = next_account_info(it)?;
        signer(owner)?;
        check_system_program(system)?;
        let mut node = self.node_at(node_ai, owner.key)?;
        if node.status != NodeStatus::Active {
            return Err(err(CohortError::NodeBusy));
        }
        if terms.available_from > terms.available_until {
            return Err(err(CohortError::InvalidInstruction));
        }
        node.stake = add(node.stake, add_stake)?;
        if add_stake > 0 {
            let accounts = [owner.clone(), node_ai.clone(), system.clone()];
            invoke_signed(
                &system_instruction::transfer(owner.key, node_ai.key, add_stake),
                &accounts,
                &[],
            )?;
        }
        node.price = terms.price;
        node.available_from = terms.available_from;
        node.available_until = terms.available_until;
        node.benchmark = terms.benchmark;
        store(node_ai, &node)
    }

    #[inline(never)]
    fn deregister_node(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(owner)?;
        let mut node = self.node_at(node_ai, owner.key)?;
        if node.status != NodeStatus::Active || node.active_job != Pubkey::default() {
            return Err(err(CohortError::NodeBusy));
        }
        node.status = NodeStatus::Deregistering;
        node.unlock_at = now
            .checked_add(NODE_COOLDOWN_SECS)
            .ok_or(err(CohortError::Overflow))?;
        store(node_ai, &node)
    }

    #[inline(never)]
    fn close_node(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(owner)?;
        let node = self.node_at(node_ai, owner.key)?;
        if node.status != NodeStatus::Deregistering {
            return Err(err(CohortError::NotDeregistering));
        }
        if now < node.unlock_at {
            return Err(err(CohortError::CooldownActive));
        }
        close_account(node_ai, owner)
    }

    #[inline(never)]
    fn create_job(&self, job_id: u64, spec: JobSpec, deposit: u64) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let requester = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let requester_ai = next_account_info(it)?;
        let system = next_account_info(it)?;
        let rent = rent(next_account_info(it)?)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(requester)?;
        check_system_program(system)?;
        spec.validate()?;
        let full = spec.full_budget().ok_or(err(CohortError::Overflow))?;
        if deposit < full {
            return Err(err(CohortError::InsufficientDeposit));
        }
        let (addr, bump) = pda::job(self.program_id, requester.key, job_id);
        same(job_ai.key, &addr, CohortError::InvalidPda)?;
        let mut ids = self.requester_at(requester_ai, requester, system, &rent)?;
        if job_id < ids.next_job_id {
            return Err(err(CohortError::JobIdUsed));
        }
        ids.next_job_id = job_id.checked_add(1).ok_or(err(CohortError::Overflow))?;
        store(requester_ai, &ids)?;
        let id = job_id.to_le_bytes();
        self.create_pda(
            requester,
            job_ai,
            system,
            &rent,
            &[pda::JOB_SEED, requester.key.as_ref(), &id, &[bump]],
            Job::LEN,
            deposit,
        )?;
        let job = Job {
            bump,
            requester: *requester.key,
            job_id,
            spec,
            deposit,
            slashed: 0,
            owed: 0,
            paid_out: 0,
            refunded: 0,
            reserve: 0,
            state: JobState::Open,
            epochs_started: 0,
            epochs_finalized: 0,
            epochs_skipped: 0,
            latest_epoch: NO_EPOCH,
            member_count: 0,
            created_at: now,
            deadline: now
                .checked_add(spec.join_window_secs as i64)
                .ok_or(err(CohortError::Overflow))?,
            ended_at: 0,
            total_points: 0,
            latest_root: [0; 32],
            latest_model_hash: [0; 32],
        };
        store(job_ai, &job)
    }

    #[inline(never)]
    fn join_job(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let member_ai = next_account_info(it)?;
        let system = next_account_info(it)?;
        let rent = rent(next_account_info(it)?)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(owner)?;
        check_system_program(system)?;
        let mut node = self.node_at(node_ai, owner.key)?;
        let mut job = self.job_at(job_ai)?;
        may_join(&job, &Candidate::of(&node), now)?;
        let (addr, bump) = pda::member(self.program_id, job_ai.key, owner.key);
        same(member_ai.key, &addr, CohortError::InvalidPda)?;
        // Joining while an epoch is open counts that epoch as present: the
        // member may train in it, so its points may include it.
        let from = job.open_epoch().unwrap_or(job.epochs_started);
        let mut member = if member_ai.owner == self.program_id {
            // Rejoining after leaving keeps what was claimed and the epochs
            // counted; the Member account cannot be closed while the job
            // lives, so this is the only way back in.
            let old = self.member_at(member_ai, job_ai.key)?;
            match old.status {
                MemberStatus::Active => return Err(err(CohortError::AlreadyMember)),
                MemberStatus::Slashed => return Err(err(CohortError::NotActiveMember)),
                MemberStatus::Left => old,
            }
        } else {
            self.create_pda(
                owner,
                member_ai,
                system,
                &rent,
                &[
                    pda::MEMBER_SEED,
                    job_ai.key.as_ref(),
                    owner.key.as_ref(),
                    &[bump],
                ],
                Member::LEN,
                0,
            )?;
            Member {
                bump,
                job: *job_ai.key,
                node: *owner.key,
                index: 0,
                joined_epoch: 0,
                status: MemberStatus::Active,
                last_voted_epoch: NO_VOTE,
                claimed: 0,
                first_epoch: from,
                epochs_present: 0,
                stint_from: from,
                stint_to: ONGOING,
                slashed: 0,
                evidence: [0; 32],
            }
        };
        member.index = job.member_count;
        member.joined_epoch = job.epochs_started;
        member.status = MemberStatus::Active;
        member.start_stint(from);
        job.member_count += 1;
        node.active_job = *job_ai.key;
        store(member_ai, &member)?;
        store(node_ai, &node)?;
        store(job_ai, &job)
    }

    /// Takes `member` out of the dense index range by moving the job's last
    /// member into its slot, so committees never draw an empty seat.
    fn remove_member(
        &self,
        job: &mut Job,
        job_key: &Pubkey,
        member: &mut Member,
        member_ai: &AccountInfo,
        last_ai: &AccountInfo,
    ) -> Res<()> {
        let last_index = job
            .member_count
            .checked_sub(1)
            .ok_or(err(CohortError::Overflow))?;
        if member_ai.key == last_ai.key {
            if member.index != last_index {
                return Err(err(CohortError::NotLastMember));
            }
        } else {
            let mut last = self.member_at(last_ai, job_key)?;
            if last.index != last_index || last.status != MemberStatus::Active {
                return Err(err(CohortError::NotLastMember));
            }
            last.index = member.index;
            store(last_ai, &last)?;
        }
        job.member_count = last_index;
        Ok(())
    }

    #[inline(never)]
    fn leave_job(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let member_ai = next_account_info(it)?;
        let last_ai = next_account_info(it)?;
        signer(owner)?;
        let mut node = self.node_at(node_ai, owner.key)?;
        let mut job = self.job_at(job_ai)?;
        let mut member = self.member_at(member_ai, job_ai.key)?;
        same(&member.node, owner.key, CohortError::AccountMismatch)?;
        if member.status != MemberStatus::Active {
            return Err(err(CohortError::NotActiveMember));
        }
        self.remove_member(&mut job, job_ai.key, &mut member, member_ai, last_ai)?;
        member.status = MemberStatus::Left;
        // Leaving does not end accountability: the epochs it was in stay
        // counted (for its pay) and reportable (for its stake).
        member.end_stint(job.epochs_started);
        if node.active_job == *job_ai.key {
            node.active_job = Pubkey::default();
        }
        store(member_ai, &member)?;
        store(node_ai, &node)?;
        store(job_ai, &job)
    }

    #[inline(never)]
    fn start_epoch(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let cranker = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let epoch_ai = next_account_info(it)?;
        let system = next_account_info(it)?;
        let rent = rent(next_account_info(it)?)?;
        let clock = clock(next_account_info(it)?)?;
        let now = clock.unix_timestamp;
        signer(cranker)?;
        check_system_program(system)?;
        let mut job = self.job_at(job_ai)?;
        match job.state {
            JobState::Open => {}
            JobState::Running if job.epochs_closed() == job.epochs_started => {}
            JobState::Running => return Err(err(CohortError::EpochNotFinalized)),
            _ => return Err(err(CohortError::InvalidJobState)),
        }
        if job.epochs_started >= job.spec.epochs {
            return Err(err(CohortError::InvalidJobState));
        }
        if job.member_count < job.members_to_start() {
            return Err(err(CohortError::NotEnoughMembers));
        }
        let index = job.epochs_started;
        let (addr, bump) = pda::epoch(self.program_id, job_ai.key, index);
        same(epoch_ai.key, &addr, CohortError::InvalidPda)?;
        self.create_pda(
            cranker,
            epoch_ai,
            system,
            &rent,
            &[
                pda::EPOCH_SEED,
                job_ai.key.as_ref(),
                &index.to_le_bytes(),
                &[bump],
            ],
            Epoch::LEN,
            0,
        )?;
        let reserve = (job.member_count as u128)
            .checked_mul(job.spec.max_price as u128)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or(err(CohortError::Overflow))?;
        job.reserve = reserve;
        if job.refundable().is_none() {
            return Err(err(CohortError::PayoutExceedsDeposit));
        }
        let deadline = now
            .checked_add(job.spec.max_epoch_secs as i64)
            .ok_or(err(CohortError::Overflow))?;
        // The committee is drawn at `seal_epoch` from the hash of a slot
        // that does not exist yet: the cranker cannot know it.
        let seal_slot = clock
            .slot
            .checked_add(SEAL_DELAY_SLOTS)
            .ok_or(err(CohortError::Overflow))?;
        let epoch = Box::new(Epoch {
            bump,
            job: *job_ai.key,
            index,
            seed: [0; 32],
            members_at_start: job.member_count,
            started_at: now,
            deadline,
            rent_payer: *cranker.key,
            seal_slot,
            sealed: false,
            witnesses: Box::new([Pubkey::default(); MAX_WITNESSES]),
            voted_mask: 0,
            votes: Box::new([[0; 32]; MAX_WITNESSES]),
            finalized: false,
            skipped: false,
            digest: [0; 32],
            root: [0; 32],
            total_points: 0,
            model_hash: [0; 32],
        });
        job.state = JobState::Running;
        job.epochs_started += 1;
        job.deadline = deadline;
        msg!(
            "cohort: epoch {} started with {} members, sealed from slot {}",
            index,
            job.member_count,
            seal_slot
        );
        store(epoch_ai, &*epoch)?;
        store(job_ai, &job)
    }

    /// Fixes the open epoch's seed and committee from the hash of its seal
    /// slot, and records each seat's node owner. The sender only names the
    /// accounts: the seats are the program's draw, and each named Member
    /// must be the active member at the drawn index, so no sender (the
    /// cranker, a member, anyone) can choose or move a seat. A drawn member
    /// that joined after the start holds no seat (it did not train from the
    /// start). If the sysvar has forgotten the seal slot, the epoch is
    /// re-targeted at a fresh future slot instead.
    #[inline(never)]
    fn seal_epoch(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let job_ai = next_account_info(it)?;
        let epoch_ai = next_account_info(it)?;
        let clock = clock(next_account_info(it)?)?;
        let hashes_ai = next_account_info(it)?;
        let job = self.job_at(job_ai)?;
        let mut epoch = self.epoch_at(epoch_ai, job_ai.key)?;
        if job.open_epoch() != Some(epoch.index) {
            return Err(err(CohortError::WrongEpoch));
        }
        if epoch.sealed {
            return Err(err(CohortError::EpochSealed));
        }
        let found = seal_hash(&slot_hashes(hashes_ai)?, epoch.seal_slot)
            .ok_or(err(CohortError::WrongSysvar))?;
        let hash = match found {
            SealHash::Ready(h) => h,
            SealHash::TooEarly => return Err(err(CohortError::SealTooEarly)),
            SealHash::Expired => {
                epoch.seal_slot = clock
                    .slot
                    .checked_add(SEAL_DELAY_SLOTS)
                    .ok_or(err(CohortError::Overflow))?;
                msg!(
                    "cohort: epoch {} re-targeted at slot {}",
                    epoch.index,
                    epoch.seal_slot
                );
                return store(epoch_ai, &*epoch);
            }
        };
        let n = epoch.members_at_start.min(job.member_count);
        let (seed, committee) =
            seal_committee(&hash, job_ai.key, epoch.index, n, job.spec.witness_count);
        let named = it.as_slice();
        if named.len() != committee.seats() as usize {
            return Err(err(CohortError::InvalidInstruction));
        }
        for (seat, (index, ai)) in committee.members().zip(named).enumerate() {
            let m = self.member_at(ai, job_ai.key)?;
            if m.status != MemberStatus::Active || m.index != index {
                return Err(err(CohortError::AccountMismatch));
            }
            if m.joined_epoch <= epoch.index {
                epoch.witnesses[seat] = m.node;
            }
        }
        epoch.seed = seed;
        epoch.sealed = true;
        msg!(
            "cohort: epoch {} sealed, {} seats",
            epoch.index,
            committee.seats()
        );
        store(epoch_ai, &*epoch)
    }

    #[inline(never)]
    fn attest_epoch(
        &self,
        epoch_index: u32,
        model_hash: Hash32,
        root: Hash32,
        total_points: u64,
    ) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let witness = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let member_ai = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let epoch_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(witness)?;
        let mut node = self.node_at(node_ai, witness.key)?;
        let mut job = self.job_at(job_ai)?;
        let mut member = self.member_at(member_ai, job_ai.key)?;
        let mut epoch = self.epoch_at(epoch_ai, job_ai.key)?;
        same(&member.node, witness.key, CohortError::AccountMismatch)?;
        if epoch.finalized && epoch.index == epoch_index {
            return Err(err(CohortError::EpochFinalized));
        }
        // An open epoch of a cancelled job may still finish, so its members get paid.
        if job.open_epoch() != Some(epoch_index) || epoch.index != epoch_index {
            return Err(err(CohortError::WrongEpoch));
        }
        if now > epoch.deadline {
            return Err(err(CohortError::DeadlinePassed));
        }
        if !epoch.sealed {
            return Err(err(CohortError::EpochNotSealed));
        }
        // Seats are keys fixed at the seal: a witness that left since keeps
        // its vote (it trained the epoch); a slashed one loses it.
        if member.status == MemberStatus::Slashed {
            return Err(err(CohortError::NotWitness));
        }
        let seat = epoch
            .seat_of(witness.key)
            .ok_or(err(CohortError::NotWitness))?;
        if member.last_voted_epoch == epoch_index || epoch.voted_mask & (1 << seat) != 0 {
            return Err(err(CohortError::AlreadyVoted));
        }
        // Each epoch adds at most one point per member per step.
        let cap = (job.spec.steps_per_epoch as u64)
            .checked_mul(epoch.members_at_start as u64)
            .ok_or(err(CohortError::Overflow))?;
        if total_points < job.total_points || total_points - job.total_points > cap {
            return Err(err(CohortError::PointsExceedBudget));
        }
        let digest = merkle::epoch_digest(
            self.program_id,
            job_ai.key,
            epoch_index,
            &model_hash,
            &root,
            total_points,
        );
        epoch.votes[seat as usize] = digest;
        epoch.voted_mask |= 1 << seat;
        member.last_voted_epoch = epoch_index;
        node.epochs_attested = node.epochs_attested.saturating_add(1);
        let agreeing = (0..MAX_WITNESSES)
            .filter(|s| epoch.voted_mask & (1 << s) != 0 && epoch.votes[*s] == digest)
            .count();
        if agreeing >= job.spec.quorum as usize {
            let owed = job
                .points_value(total_points)
                .ok_or(err(CohortError::Overflow))?;
            let added = sub(owed, job.owed)?;
            if added > job.reserve {
                return Err(err(CohortError::PointsExceedBudget));
            }
            job.owed = owed;
            job.reserve = 0;
            job.total_points = total_points;
            job.latest_root = root;
            job.latest_model_hash = model_hash;
            job.latest_epoch = epoch_index;
            job.epochs_finalized += 1;
            epoch.finalized = true;
            epoch.digest = digest;
            epoch.root = root;
            epoch.total_points = total_points;
            epoch.model_hash = model_hash;
            msg!(
                "cohort: epoch {} finalized, {} points",
                epoch_index,
                total_points
            );
            if job.state == JobState::Running {
                if job.epochs_closed() >= job.spec.epochs {
                    job.state = JobState::Completed;
                } else {
                    job.deadline = now
                        .checked_add(job.spec.max_epoch_secs as i64)
                        .ok_or(err(CohortError::Overflow))?;
                }
            }
            // The claim window counts from the latest finalization, so a
            // cancelled job's late epoch gets the full window too. Nothing
            // is paid to the requester here: refunds are pulled (`withdraw`).
            if job.state.is_terminal() {
                job.ended_at = now;
            }
        }
        store(epoch_ai, &*epoch)?;
        store(member_ai, &member)?;
        store(node_ai, &node)?;
        store(job_ai, &job)
    }

    #[inline(never)]
    fn claim(&self, points: u64, proof: &[Hash32]) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let member_ai = next_account_info(it)?;
        signer(owner)?;
        let mut job = self.job_at(job_ai)?;
        let mut member = self.member_at(member_ai, job_ai.key)?;
        same(&member.node, owner.key, CohortError::AccountMismatch)?;
        if member.status == MemberStatus::Slashed {
            return Err(err(CohortError::NotActiveMember));
        }
        if job.epochs_finalized == 0 {
            return Err(err(CohortError::NoFinalizedRoot));
        }
        let payout = settle(&mut job, &mut member, owner.key, points, proof)?;
        if payout == 0 {
            return Err(err(CohortError::NothingToClaim));
        }
        move_lamports(job_ai, owner, payout)?;
        store(member_ai, &member)?;
        store(job_ai, &job)
    }

    #[inline(never)]
    fn report_fraud(&self, epoch_index: u32, evidence: Hash32) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let job_ai = next_account_info(it)?;
        let epoch_ai = next_account_info(it)?;
        let accused_ai = next_account_info(it)?;
        let accused_node_ai = next_account_info(it)?;
        let last_ai = next_account_info(it)?;
        let burn_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        let case_ai = next_account_info(it)?;
        let payer = next_account_info(it)?;
        let system = next_account_info(it)?;
        let rent = rent(next_account_info(it)?)?;
        incinerator(burn_ai)?;
        check_system_program(system)?;
        let mut job = self.job_at(job_ai)?;
        let epoch = self.epoch_at(epoch_ai, job_ai.key)?;
        if !job.fraud_targetable(epoch_index, now) || epoch.index != epoch_index {
            return Err(err(CohortError::WrongEpoch));
        }
        let mut accused = self.member_at(accused_ai, job_ai.key)?;
        // A member that left is still accountable for the epochs it was in.
        if accused.status == MemberStatus::Slashed {
            return Err(err(CohortError::NotActiveMember));
        }
        if !accused.present_in(epoch_index) {
            return Err(err(CohortError::NotPresent));
        }
        let mut node = self.node_at(accused_node_ai, &accused.node)?;
        let mut case = self.fraud_case_at(
            case_ai,
            payer,
            system,
            &rent,
            job_ai.key,
            &accused.node,
            epoch_index,
            evidence,
        )?;
        if !epoch.sealed {
            return Err(err(CohortError::EpochNotSealed));
        }
        let mut seen: [Option<Pubkey>; MAX_WITNESSES] = [None; MAX_WITNESSES];
        let rest = it.as_slice();
        if rest.is_empty() || !rest.len().is_multiple_of(2) || rest.len() / 2 > MAX_WITNESSES {
            return Err(err(CohortError::InvalidInstruction));
        }
        for (listed, pair) in rest.chunks(2).enumerate() {
            let (w, wm_ai) = (&pair[0], &pair[1]);
            signer(w)?;
            if seen[..listed].contains(&Some(*w.key)) {
                return Err(err(CohortError::DuplicateAccount));
            }
            let wm = self.member_at(wm_ai, job_ai.key)?;
            same(&wm.node, w.key, CohortError::AccountMismatch)?;
            // The seat fixed at the seal; a slashed witness has no vote.
            if wm.status == MemberStatus::Slashed || epoch.seat_of(w.key).is_none() {
                return Err(err(CohortError::NotWitness));
            }
            seen[listed] = Some(*w.key);
            // A witness counts once per case, whichever transaction carries it.
            let n = case.votes as usize;
            if !case.voters[..n].contains(w.key) {
                if n >= MAX_WITNESSES {
                    return Err(err(CohortError::InvalidInstruction));
                }
                case.voters[n] = *w.key;
                case.votes += 1;
            }
        }
        if (case.votes as usize) < job.spec.quorum as usize {
            msg!(
                "cohort: fraud vote recorded, {} of {} against {}",
                case.votes,
                job.spec.quorum,
                accused.node
            );
            return store(case_ai, &*case);
        }
        case.slashed = true;
        store(case_ai, &*case)?;
        // At most the stake the job asked for, and burned: nobody who can
        // trigger a slash (a requester with Sybil witnesses, a quorum) gains
        // a lamport from it.
        let stake = node.stake.min(job.spec.min_stake);
        node.stake = sub(node.stake, stake)?;
        node.slashes = node.slashes.saturating_add(1);
        node.audits_failed = node.audits_failed.saturating_add(1);
        if node.active_job == *job_ai.key {
            node.active_job = Pubkey::default();
        }
        job.slashed = add(job.slashed, stake)?;
        move_lamports(accused_node_ai, burn_ai, stake)?;
        if accused.status == MemberStatus::Active {
            self.remove_member(&mut job, job_ai.key, &mut accused, accused_ai, last_ai)?;
            accused.end_stint(job.epochs_started);
        }
        accused.status = MemberStatus::Slashed;
        accused.slashed = stake;
        accused.evidence = case.evidence;
        msg!(
            "cohort: member {} slashed, {} lamports burned, evidence {:?}",
            accused.node,
            stake,
            &case.evidence[..8]
        );
        store(accused_ai, &accused)?;
        store(accused_node_ai, &node)?;
        store(job_ai, &job)
    }

    #[inline(never)]
    fn cancel_job(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let requester = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(requester)?;
        let mut job = self.job_at(job_ai)?;
        same(requester.key, &job.requester, CohortError::NotRequester)?;
        if job.state.is_terminal() {
            return Err(err(CohortError::InvalidJobState));
        }
        job.state = JobState::Cancelled;
        job.ended_at = now;
        store(job_ai, &job)
    }

    /// Ends a job nobody moves forward: no epoch started within
    /// `max_epoch_secs` of the last one closing (or of the join window's
    /// end). An open epoch that timed out is skipped instead (`skip_epoch`),
    /// and the job goes on.
    #[inline(never)]
    fn expire_job(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let job_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        let mut job = self.job_at(job_ai)?;
        if !matches!(job.state, JobState::Open | JobState::Running) {
            return Err(err(CohortError::InvalidJobState));
        }
        if job.open_epoch().is_some() {
            return Err(err(CohortError::EpochOpen));
        }
        if now <= job.deadline {
            return Err(err(CohortError::DeadlineNotReached));
        }
        job.state = JobState::Expired;
        job.ended_at = now;
        store(job_ai, &job)
    }

    /// Closes the open epoch unpaid once its deadline has passed without a
    /// quorum: its reserve is released, its members are owed nothing for
    /// it, and the job goes on with the next epoch (or completes, if it was
    /// the last). One stalled epoch no longer ends the job.
    #[inline(never)]
    fn skip_epoch(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let job_ai = next_account_info(it)?;
        let epoch_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        let mut job = self.job_at(job_ai)?;
        let mut epoch = self.epoch_at(epoch_ai, job_ai.key)?;
        if job.open_epoch() != Some(epoch.index) || epoch.finalized {
            return Err(err(CohortError::WrongEpoch));
        }
        if now <= epoch.deadline {
            return Err(err(CohortError::DeadlineNotReached));
        }
        epoch.skipped = true;
        job.reserve = 0;
        job.epochs_skipped = add(job.epochs_skipped as u64, 1)? as u32;
        match job.state {
            JobState::Running if job.epochs_closed() >= job.spec.epochs => {
                job.state = JobState::Completed;
                job.ended_at = now;
            }
            JobState::Running => {
                job.deadline = now
                    .checked_add(job.spec.max_epoch_secs as i64)
                    .ok_or(err(CohortError::Overflow))?;
            }
            // A cancelled job's last epoch: the claim window counts from here.
            _ => job.ended_at = now,
        }
        msg!("cohort: epoch {} skipped unattested", epoch.index);
        store(epoch_ai, &*epoch)?;
        store(job_ai, &job)
    }

    /// A Member is the only record of what its node was paid and whether it
    /// was slashed, so it lives as long as its job can pay or slash: while
    /// the job account exists and is not terminal it cannot be closed (a
    /// re-created Member would start from `claimed = 0`); inside the claim
    /// window closing first settles what the member is still owed.
    #[inline(never)]
    fn close_member(&self, points: u64, proof: &[Hash32]) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let owner = next_account_info(it)?;
        let node_ai = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let member_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(owner)?;
        let mut member = self.member_at(member_ai, job_ai.key)?;
        same(&member.node, owner.key, CohortError::AccountMismatch)?;
        let mut node = self.node_at(node_ai, owner.key)?;
        if !is_closed(job_ai, self.program_id) {
            let mut job = self.job_at(job_ai)?;
            if !job.state.is_terminal() || job.reserve > 0 {
                return Err(err(CohortError::MemberLocked));
            }
            let owed_maybe = member.status != MemberStatus::Slashed && job.epochs_finalized > 0;
            if owed_maybe && job.in_claim_window(now) {
                let payout = settle(&mut job, &mut member, owner.key, points, proof)?;
                move_lamports(job_ai, owner, payout)?;
                store(job_ai, &job)?;
            }
        }
        if node.active_job == *job_ai.key {
            node.active_job = Pubkey::default();
            store(node_ai, &node)?;
        }
        close_account(member_ai, owner)
    }

    #[inline(never)]
    fn close_epoch(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let payer = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let epoch_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        let epoch = self.epoch_at(epoch_ai, job_ai.key)?;
        same(payer.key, &epoch.rent_payer, CohortError::AccountMismatch)?;
        if !is_closed(job_ai, self.program_id) {
            let job = self.job_at(job_ai)?;
            if job.open_epoch() == Some(epoch.index) {
                return Err(err(CohortError::EpochOpen));
            }
            // A fraud report needs the epoch's seed to find its committee.
            if job.fraud_targetable(epoch.index, now) {
                return Err(err(CohortError::EpochReportable));
            }
        }
        close_account(epoch_ai, payer)
    }

    /// Closes a finished job: what members were owed but did not claim in
    /// the window is burned (never refunded: a requester must not profit
    /// from members it got slashed or blocked), the rest and the rent go
    /// back to the requester.
    #[inline(never)]
    fn close_job(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let requester = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let burn_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        signer(requester)?;
        incinerator(burn_ai)?;
        let job = self.job_at(job_ai)?;
        same(requester.key, &job.requester, CohortError::NotRequester)?;
        if !job.state.is_terminal() || job.reserve > 0 {
            return Err(err(CohortError::InvalidJobState));
        }
        let unclaimed = sub(job.owed, job.paid_out)?;
        if unclaimed > 0 && job.in_claim_window(now) {
            return Err(err(CohortError::ClaimWindowOpen));
        }
        move_lamports(job_ai, burn_ai, unclaimed)?;
        close_account(job_ai, requester)
    }

    /// A settled case, or one nobody can vote on any more, gives its rent back.
    #[inline(never)]
    fn close_fraud_case(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let payer = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        let case_ai = next_account_info(it)?;
        let now = clock(next_account_info(it)?)?.unix_timestamp;
        let case: FraudCase = load(case_ai, self.program_id)?;
        same(&case.job, job_ai.key, CohortError::AccountMismatch)?;
        let (addr, _) = pda::fraud_case(self.program_id, &case.job, &case.accused, case.epoch);
        same(case_ai.key, &addr, CohortError::InvalidPda)?;
        same(payer.key, &case.rent_payer, CohortError::AccountMismatch)?;
        if !case.slashed && !is_closed(job_ai, self.program_id) {
            let job = self.job_at(job_ai)?;
            if job.fraud_targetable(case.epoch, now) {
                return Err(err(CohortError::EpochReportable));
            }
        }
        close_account(case_ai, payer)
    }

    /// The requester pulls what the job no longer needs. Nothing else ever
    /// pays the requester, so no other party's instruction can fail because
    /// of the requester's wallet.
    #[inline(never)]
    fn withdraw(&self) -> ProgramResult {
        let it = &mut self.accounts.iter();
        let requester = next_account_info(it)?;
        let job_ai = next_account_info(it)?;
        signer(requester)?;
        let mut job = self.job_at(job_ai)?;
        same(requester.key, &job.requester, CohortError::NotRequester)?;
        // Until the job ends, its deposit funds the epochs still to come.
        if !job.state.is_terminal() {
            return Err(err(CohortError::InvalidJobState));
        }
        let amount = job
            .refundable()
            .ok_or(err(CohortError::PayoutExceedsDeposit))?;
        if amount == 0 {
            return Err(err(CohortError::NothingToWithdraw));
        }
        job.refunded = add(job.refunded, amount)?;
        move_lamports(job_ai, requester, amount)?;
        store(job_ai, &job)
    }
}

/// Checks `(owner, points)` against the latest root and the member's
/// presence, and books what the member is still owed; returns that amount.
/// The one place a member's pay is computed (claim and close_member).
fn settle(
    job: &mut Job,
    member: &mut Member,
    owner: &Pubkey,
    points: u64,
    proof: &[Hash32],
) -> Res<u64> {
    if !merkle::verify(merkle::leaf(owner, points), proof, &job.latest_root) {
        return Err(err(CohortError::InvalidProof));
    }
    // However the quorum filled the table, a member earns at most one
    // point per step of each epoch it took part in.
    if points > job.points_cap(member.epochs_present(job.epochs_started)) {
        return Err(err(CohortError::PointsExceedPresence));
    }
    let entitled = job.points_value(points).ok_or(err(CohortError::Overflow))?;
    let payout = entitled.saturating_sub(member.claimed);
    let paid = add(job.paid_out, payout)?;
    if paid > job.owed {
        return Err(err(CohortError::PayoutExceedsDeposit));
    }
    job.paid_out = paid;
    member.claimed = member.claimed.max(entitled);
    Ok(payout)
}
