//! `cohort-bench <name>`: each benchmark prints its figures beside the
//! baseline it is measured against, in the same run, and writes them to
//! `docs/bench/<name>.json` and `docs/benchmarks.md`.

mod adversary;
mod app;
mod args;
mod chain;
mod chain_job;
mod convergence;
mod efficiency;
mod engine;
mod large_model;
mod peers;
mod plot;
mod report;
mod runlog;
mod simulate;
mod traffic;

const USAGE: &str = "usage: cohort-bench <convergence|engine|efficiency|simulate|large-model|traffic|chain|adversary|app|peer> [--flag value ...]

  convergence  dense AdamW vs dense sign-SGD vs Cohort compressed, same tokens, each tuned
               over one lr x momentum grid, its best point over several seeds; resumable
               (runs kept in docs/bench/convergence-runs.jsonl); flags: --steps 2000
               --lrs 0.0003,0.001,0.003 --momenta 0.9,0.95,0.99 --grid-seeds 1 --seeds 3
               --methods adamw,sign,cohort,shared (also: topagg<K>) --schedule stale|lockstep
               --reference yes --members 4 --batch 8 --arch --topk 4 (top-k rule)
               --shared-k 61 (shared rule) --decode sign|rms --adaptive 0
               --eval-windows 64 --max-runs N --part i/n (every n-th run from the i-th:
               n processes share a sweep) --plan yes (list the runs still to do)
               --name convergence (another name publishes its own section and JSON)
  engine       one member's training tokens/s vs the same model in PyTorch
               flags: --arch --batch --steps --backend (auto|cpu|wgpu|cuda) --threads --repeats 3
  efficiency   member processes over libp2p, shaped links vs the same processes on loopback
               flags: --members (cores) --steps --arch --batch --mbit --rtt-ms --slow-rtt-ms (0: ≈ compute) --warmup --repeats 3
  simulate     the step protocol in virtual time: 48 nodes and 1,000 nodes
               flags: --arch --gpus-per-node --gpu-tflops --mfu --tokens-per-gpu --steps
               --collect-secs 3 --fetch-failure 0.01 ...
  large-model  a ~100 M-parameter job as 3 processes, one joining late: parts over 1 MiB,
               peak memory per process, states on disk vs in memory
               flags: --arch \"gpt l8 d1024 h16 s64\" --topk 32 --steps 6 --batch 1 --join-at 2
  traffic      bytes a member sends and receives per step, all-to-all vs sharded exchange,
               as member processes on shaped loopback links; flags: --members 8 --steps 6
               --arch \"gpt l4 d512 h8 s64\" --batch 1 --shards (members) --redundancy 2 --mbit 100 --rtt-ms 20 --repeats 3
  chain        a real job's transactions, fees and balances read from the chain, then
               modelled jobs of 3, 30, 300 members; flags: --sizes 3,30,300 --epochs 3
               --real-nodes 3 --real-epochs 3 --real-steps 10
  adversary    honest run vs 33/45% attackers of every payload attack, defences on and off, and
               the honest members alone, over several seeds; resumable (runs kept in
               docs/bench/adversary-runs.jsonl); flags: --members 9 --steps 100 --epoch 10
               --fractions 0.33,0.45 --modes all --undefended yes --seeds 3
               --witness-micro-batch 4 --rule topk|shared (topk: the rule the tables were
               measured under) --plan yes (list the runs still to do)
               --name adversary (the JSON and docs section it writes: another name
               keeps a sweep in other settings beside the default one)
  app          the desktop app's cold start vs an empty window, and frame time while training
               (needs a display: xvfb-run -a); flags: --launches 5
  peer         one member process (what `efficiency` spawns); see --help
";

fn main() {
    // The embedded bank logs every instruction unless told otherwise.
    if std::env::var_os("RUST_LOG").is_none() {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("RUST_LOG", "error") };
    }
    // The engine's own events (`COHORT_LOG=trace` shows a simulation's
    // every event, for instance).
    cohort_engine::logs::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("convergence") => convergence::run(&args[1..]),
        Some("engine") => engine::run(&args[1..]),
        Some("efficiency") => efficiency::run(&args[1..]),
        Some("simulate") => simulate::run(&args[1..]),
        Some("large-model") => large_model::run(&args[1..]),
        Some("traffic") => traffic::run(&args[1..]),
        Some("chain") => chain::run(&args[1..]),
        Some("adversary") => adversary::run(&args[1..]),
        Some("app") => app::run(&args[1..]),
        Some("peer") => std::process::exit(cohort_engine::net::peer::main(&args[1..])),
        Some("-h") | Some("--help") | None => {
            print!("{USAGE}");
            return;
        }
        Some(other) => Err(anyhow::anyhow!("unknown benchmark `{other}`\n{USAGE}")),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
