//! One job member as its own OS process (tests and benchmarks spawn these).
fn main() {
    cohort_engine::logs::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(cohort_engine::net::peer::main(&args));
}
