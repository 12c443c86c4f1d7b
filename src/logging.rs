//! Logging to stderr, at the levels `GPUWATCH_LOG` gives: the same for both executables
//! (`gpuwatch` and the cluster controller's `gpuwatch-controller`).

/// Logs to stderr, at the levels `GPUWATCH_LOG` gives (see `log_filter`); unset or not
/// understood, at `info`.
pub fn init() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let text = std::env::var("GPUWATCH_LOG").unwrap_or_default();
    let (filter, bad) = match log_filter(&text) {
        Ok(f) => (f, None),
        Err(e) => (everything_at_info(), Some(e)),
    };
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        // A closed stderr must not take the daemon down: log lines are dropped instead.
        .log_internal_errors(false);
    tracing_subscriber::registry()
        .with(format)
        .with(filter)
        .init();
    if let Some(e) = bad {
        tracing::warn!("GPUWATCH_LOG={text:?}: {e}; logging at info");
    }
}

fn everything_at_info() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_default(tracing_subscriber::filter::LevelFilter::INFO)
}

/// A log filter: comma-separated entries, each a level (the default for every target) or
/// `target=level`, with spaces around entries and empty entries ignored. Nothing at all is
/// `info`. Levels are `off`, `error`, `warn`, `info`, `debug` and `trace`, in any case.
fn log_filter(text: &str) -> Result<tracing_subscriber::filter::Targets, String> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let not_understood = |entry: &str| {
        format!(
            "{entry:?} is not a level (off, error, warn, info, debug or trace) or a target=level"
        )
    };
    let level = |entry: &str, word: &str| {
        word.trim()
            .parse::<LevelFilter>()
            .map_err(|_| not_understood(entry))
    };
    let entries: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if entries.is_empty() {
        return Ok(everything_at_info());
    }
    let mut filter = Targets::new();
    for entry in entries {
        filter = match entry.split_once('=') {
            Some((target, word)) if !target.trim().is_empty() => {
                filter.with_target(target.trim(), level(entry, word)?)
            }
            Some(_) => return Err(not_understood(entry)),
            None => filter.with_default(level(entry, entry)?),
        };
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::log_filter;
    use tracing::Level;

    fn enabled(text: &str, target: &str, level: Level) -> bool {
        log_filter(text).unwrap().would_enable(target, &level)
    }

    #[test]
    fn log_filters_read_as_a_person_writes_them() {
        assert!(enabled("", "gpuwatch", Level::INFO) && !enabled("", "gpuwatch", Level::DEBUG));
        assert!(enabled("warn,", "gpuwatch", Level::WARN) && !enabled("warn,", "x", Level::INFO));
        assert!(enabled("WARN", "gpuwatch", Level::ERROR));
        let both = "info, gpuwatch=debug";
        assert!(
            enabled(both, "gpuwatch::app", Level::DEBUG) && !enabled(both, "hyper", Level::DEBUG)
        );
        assert!(enabled(both, "hyper", Level::INFO));
        for bad in ["warning", "gpuwatch=loud", "=debug", "info,verbose"] {
            let e = log_filter(bad).unwrap_err();
            assert!(e.contains("is not a level"), "{bad}: {e}");
        }
    }
}
