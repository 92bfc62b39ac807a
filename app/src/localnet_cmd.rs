//! `cohort localnet` and `cohort airdrop`.

use crate::chain::embedded::Embedded;
use crate::chain::localnet::Server;
use crate::chain::sol;
use crate::cli::{CHAIN_FLAGS, Flags, sol_to_lamports};
use anyhow::{Result, anyhow, bail};
use solana_sdk::pubkey::Pubkey;
use solana_sdk::signature::Signer;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;

pub async fn main(args: &[String]) -> Result<()> {
    let f = Flags::parse(args, "cohort localnet", &["port"])?;
    if let Some(w) = f.words.first() {
        bail!("unexpected argument `{w}` for `cohort localnet`");
    }
    let port: u16 = f.get("port")?.unwrap_or(8899);
    let chain = Embedded::start().await?;
    // Loopback only: a local chain has a free faucet.
    let server =
        Server::start(chain.clone(), SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
    println!("localnet: Solana JSON-RPC at {}", server.url());
    println!("  program {}", cohort_program::ID);
    println!("  faucet  {} (requestAirdrop works)", chain.faucet());
    println!("Ctrl-C to stop (the chain lives in memory and ends with it)");
    serve_until_ctrl_c(chain, server).await
}

/// SIGUSR1 stops the RPC server and SIGUSR2 starts it again on the same
/// port, with the chain kept: how tests take the RPC away mid-epoch.
#[cfg(unix)]
async fn serve_until_ctrl_c(chain: Embedded, server: Server) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let addr = server.addr;
    let mut server = Some(server);
    let mut stop = signal(SignalKind::user_defined1())?;
    let mut start = signal(SignalKind::user_defined2())?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = stop.recv() => {
                if let Some(s) = server.take() {
                    s.stop();
                    println!("localnet: RPC server stopped (the chain is kept)");
                }
            }
            _ = start.recv() => {
                if server.is_none() {
                    server = Some(Server::start(chain.clone(), addr).await?);
                    println!("localnet: RPC server back at http://{addr}");
                }
            }
        }
    }
}

#[cfg(not(unix))]
async fn serve_until_ctrl_c(_chain: Embedded, _server: Server) -> Result<()> {
    tokio::signal::ctrl_c().await?;
    Ok(())
}

pub async fn airdrop(args: &[String]) -> Result<()> {
    let mut allowed = CHAIN_FLAGS.to_vec();
    allowed.push("to");
    let f = Flags::parse(args, "cohort airdrop", &allowed)?;
    let [amount] = f.words.as_slice() else {
        bail!("usage: cohort airdrop SOL [--to ADDRESS]");
    };
    let amount: f64 = amount
        .parse()
        .map_err(|_| anyhow!("`{amount}` is not an amount of SOL"))?;
    let lamports = sol_to_lamports(amount, "the amount")?;
    let to = match f.str("to") {
        Some(a) => Pubkey::from_str(a).map_err(|_| anyhow!("`{a}` is not a valid address"))?,
        None => f.keypair("requester.json")?.pubkey(),
    };
    let chain = f.chain().await?;
    chain.airdrop(&to, lamports).await?;
    println!("{to} now holds {}", sol(chain.balance(&to).await?));
    Ok(())
}
