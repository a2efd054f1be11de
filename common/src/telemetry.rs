//! Logging for both binaries: `tracing` with a level filter and a text or JSON format.

use tracing_subscriber::{EnvFilter, fmt};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Flags shared by every binary for logging.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Log filter: a level (error, warn, info, debug, trace) or a full `tracing` directive list
    /// such as `info,controller=debug`. `RUST_LOG` overrides it.
    /// `--zap-log-level` (the Go operator's name, as in the seed's `extraArgs` example) is
    /// accepted too.
    #[arg(
        long,
        alias = "zap-log-level",
        env = "LOG_LEVEL",
        default_value = "info"
    )]
    pub log_level: String,

    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Error from setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The `--log-level` value is not a valid filter.
    #[error(
        "--log-level {value:?} is not a valid filter ({source}); use a level such as info or debug"
    )]
    ParseFilter {
        /// What was given.
        value: String,
        /// Why it failed.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("logging was already initialised")]
    Install,
}

/// Installs the global subscriber for `args`.
pub fn init(args: &LogArgs) -> Result<(), TelemetryError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ => args.log_level.clone(),
    };
    let filter = EnvFilter::try_new(&filter).map_err(|source| TelemetryError::ParseFilter {
        value: filter.clone(),
        source,
    })?;
    // Colours only on a terminal: `kubectl logs` and log collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = fmt()
        .with_env_filter(filter)
        .with_target(true)
        .with_ansi(ansi);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|_| TelemetryError::Install)
}
