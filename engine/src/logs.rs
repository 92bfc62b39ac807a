//! Where the engine's `tracing` events go in the binaries: stderr, at the
//! level `COHORT_LOG` names (error, warn, info, debug, trace; warn when
//! unset or unknown). Libraries only emit; a binary calls [`init`] once.

use tracing_subscriber::filter::LevelFilter;

/// The level `COHORT_LOG` asks for.
pub fn level(value: Option<&str>) -> LevelFilter {
    match value.map(str::to_ascii_lowercase).as_deref() {
        Some("off") => LevelFilter::OFF,
        Some("error") => LevelFilter::ERROR,
        Some("info") => LevelFilter::INFO,
        Some("debug") => LevelFilter::DEBUG,
        Some("trace") => LevelFilter::TRACE,
        _ => LevelFilter::WARN,
    }
}

/// Installs the stderr subscriber (a second call does nothing).
pub fn init() {
    let level = level(std::env::var("COHORT_LOG").ok().as_deref());
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_level_is_read_from_its_name_and_defaults_to_warnings() {
        assert_eq!(level(Some("DEBUG")), LevelFilter::DEBUG);
        assert_eq!(level(Some("off")), LevelFilter::OFF);
        assert_eq!(level(Some("loud")), LevelFilter::WARN);
        assert_eq!(level(None), LevelFilter::WARN);
    }
}
