//! `cohort`: the desktop app, and the same binary headless: `demo`,
//! `node`, `job`, `localnet`, `wallet`.

use cohort_app::{demo, gui, job, localnet_cmd, node, wallet};

use anyhow::{Result, bail};

const USAGE: &str = "\
Cohort: join decentralized AI training with one click.

Usage:
  cohort [app]                           the desktop app (Sandbox by default; `cohort app --help`)
  cohort demo [--nodes N] [--epochs N] [--steps N]
                                         train a job end to end on an embedded local chain
  cohort localnet [--port 8899]          serve a local chain as Solana JSON-RPC on 127.0.0.1
  cohort airdrop SOL [--to ADDRESS]      fund a wallet on a local chain
  cohort job create|list|status|cancel   post and follow training jobs (`cohort job help`)
  cohort wallet new|import|address|export-keypair   the encrypted wallet (`cohort wallet help`)
  cohort node [--job JOB] [...]          register, join, train, attest and claim (`cohort node --help`)
  cohort node --peer-only --index I --members N [...]   one P2P member, no chain
  cohort --version                       print the version
  cohort --help                          print this help
";

fn main() {
    let started = std::time::Instant::now();
    // The embedded bank logs every instruction at debug level unless told otherwise.
    if std::env::var_os("RUST_LOG").is_none() {
        // SAFETY: no other thread exists yet, so nothing can read the environment concurrently.
        unsafe { std::env::set_var("RUST_LOG", "error") };
    }
    cohort_engine::logs::init();
    if let Err(e) = run(std::env::args().skip(1).collect(), started) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Vec<String>, started: std::time::Instant) -> Result<()> {
    match args.first().map(String::as_str) {
        None => gui::main(&[], started),
        Some("app") => gui::main(&args[1..], started),
        Some("--help") | Some("-h") | Some("help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some("--version") | Some("-V") => {
            println!("cohort {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Some("demo") => {
            let opts = demo::Options::parse(&args[1..])?;
            runtime()?.block_on(demo::run(opts)).map(|_| ())
        }
        Some("localnet") => runtime()?.block_on(localnet_cmd::main(&args[1..])),
        Some("airdrop") => runtime()?.block_on(localnet_cmd::airdrop(&args[1..])),
        Some("job") => runtime()?.block_on(job::main(&args[1..])),
        Some("wallet") => wallet::cli::main(&args[1..]),
        // One member of a local job on libp2p, without chain or UI (the
        // node lifecycle builds on it). Exits with the peer's own code.
        Some("node") if args.get(1).map(String::as_str) == Some("--peer-only") => {
            std::process::exit(cohort_engine::net::peer::main(&args[2..]))
        }
        Some("node") => runtime()?.block_on(node::main(&args[1..])),
        Some(other) => bail!("unknown command `{other}`; run `cohort --help`"),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_commands_are_clear_errors() {
        let e = run(vec!["frobnicate".into()], std::time::Instant::now())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown command `frobnicate`"), "{e}");
        assert!(run(vec!["--version".into()], std::time::Instant::now()).is_ok());
    }
}
