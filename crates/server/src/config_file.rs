//! `fenced serve --config FILE`: every `serve` flag as a TOML key (`data-dir = "/var/lib/fenced"`,
//! `heartbeat-ms = 50`, `tls-require-client-cert = true`, lists as arrays or comma-separated
//! strings). Flags on the command line win over the file; an unknown key, or a value of the
//! wrong kind, is an error that names the file and the key.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {} is not valid TOML: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error(
        "config file {}: unknown key '{key}'{suggestion}; the keys are the `fenced serve` flags \
         without their dashes: {known}",
        path.display()
    )]
    UnknownKey {
        path: PathBuf,
        key: String,
        suggestion: String,
        known: String,
    },
    #[error("config file {}: key '{key}': {why}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        why: String,
    },
}

/// The command line `args` (program name first) with the keys of the `--config` file of a
/// `serve` command inserted as flags after `serve`, except those the command line gives
/// itself. Unchanged when there is no `serve --config` (or `args` do not parse: the caller's
/// parse reports that).
pub fn merge(args: Vec<OsString>, cli: clap::Command) -> Result<Vec<OsString>, ConfigFileError> {
    let Ok(matches) = cli.clone().try_get_matches_from(&args) else {
        return Ok(args);
    };
    let Some(serve) = matches.subcommand_matches("serve") else {
        return Ok(args);
    };
    let Some(path) = serve.get_one::<PathBuf>("config").cloned() else {
        return Ok(args);
    };
    let Some(serve_cmd) = cli.find_subcommand("serve") else {
        return Ok(args);
    };
    // long flag → (arg id, takes a value)
    let flags: BTreeMap<String, (String, bool)> = serve_cmd
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            Some((
                long.to_owned(),
                (a.get_id().to_string(), a.get_action().takes_values()),
            ))
        })
        .filter(|(long, _)| long != "config" && long != "help")
        .collect();
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigFileError::Read {
        path: path.clone(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigFileError::Parse {
            path: path.clone(),
            message: e.message().to_owned(),
        })?;
    let mut extra: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let Some((id, takes_value)) = flags.get(key) else {
            let suggestion = flags
                .keys()
                .min_by_key(|k| edit_distance(k, key))
                .filter(|k| edit_distance(k, key) <= 3)
                .map(|k| format!(" (did you mean '{k}'?)"))
                .unwrap_or_default();
            return Err(ConfigFileError::UnknownKey {
                path,
                key: key.clone(),
                suggestion,
                known: flags.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let bad = |why: &str| ConfigFileError::BadValue {
            path: path.clone(),
            key: key.clone(),
            why: why.to_owned(),
        };
        let text = match value {
            toml::Value::String(s) => Some(s.clone()),
            toml::Value::Integer(i) => Some(i.to_string()),
            toml::Value::Boolean(b) if *takes_value => Some(b.to_string()),
            toml::Value::Boolean(true) => None,
            toml::Value::Boolean(false) => continue,
            toml::Value::Array(items) => Some(
                items
                    .iter()
                    .map(|v| match v {
                        toml::Value::String(s) => Ok(s.clone()),
                        toml::Value::Integer(i) => Ok(i.to_string()),
                        _ => Err(bad("array items must be strings or integers")),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join(","),
            ),
            _ => return Err(bad("expected a string, an integer, a boolean or an array")),
        };
        if !*takes_value && text.is_some() {
            return Err(bad("this flag takes no value: write `true` or `false`"));
        }
        if serve.value_source(id) == Some(ValueSource::CommandLine) {
            continue;
        }
        extra.push(format!("--{key}").into());
        if let Some(t) = text {
            extra.push(t.into());
        }
    }
    let at = args
        .iter()
        .position(|a| a == "serve")
        .map_or(args.len(), |i| i + 1);
    let mut out = args;
    out.splice(at..at, extra);
    Ok(out)
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{value_parser, Arg, ArgAction, Command};

    fn cli() -> Command {
        Command::new("fenced").subcommand(
            Command::new("serve")
                .arg(
                    Arg::new("config")
                        .long("config")
                        .value_parser(value_parser!(PathBuf)),
                )
                .arg(Arg::new("data_dir").long("data-dir"))
                .arg(Arg::new("heartbeat_ms").long("heartbeat-ms"))
                .arg(Arg::new("join").long("join").value_delimiter(','))
                .arg(
                    Arg::new("tls_require_client_cert")
                        .long("tls-require-client-cert")
                        .action(ArgAction::SetTrue),
                ),
        )
    }

    fn run(file: &str, extra: &[&str]) -> Result<Vec<String>, ConfigFileError> {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("fenced.toml");
        std::fs::write(&path, file).expect("write");
        let mut args: Vec<OsString> = vec!["fenced".into(), "serve".into(), "--config".into()];
        args.push(path.into());
        args.extend(extra.iter().map(OsString::from));
        merge(args, cli()).map(|a| {
            a.into_iter()
                .skip(2)
                .map(|s| s.to_string_lossy().into_owned())
                .filter(|s| !s.ends_with("fenced.toml"))
                .collect()
        })
    }

    #[test]
    fn keys_become_flags_and_the_command_line_wins() {
        let file = r#"
            data-dir = "/var/lib/fenced"
            heartbeat-ms = 50
            join = ["a:7380", "b:7380"]
            tls-require-client-cert = true
        "#;
        assert_eq!(
            run(file, &[]).expect("merged"),
            [
                "--data-dir",
                "/var/lib/fenced",
                "--heartbeat-ms",
                "50",
                "--join",
                "a:7380,b:7380",
                "--tls-require-client-cert",
                "--config"
            ]
        );
        let merged = run(file, &["--heartbeat-ms", "80"]).expect("merged");
        assert!(
            !merged.contains(&"50".to_string()) && merged.ends_with(&["80".to_string()]),
            "{merged:?}"
        );
        assert!(!run("tls-require-client-cert = false", &[])
            .expect("merged")
            .contains(&"--tls-require-client-cert".to_string()));
    }

    #[test]
    fn bad_files_are_errors_naming_the_key() {
        let e = run("data-dri = \"x\"", &[]).expect_err("typo");
        let msg = e.to_string();
        assert!(
            msg.contains("unknown key 'data-dri'") && msg.contains("did you mean 'data-dir'"),
            "{msg}"
        );
        let e = run("heartbeat-ms = { a = 1 }", &[]).expect_err("table");
        assert!(e.to_string().contains("key 'heartbeat-ms'"), "{e}");
        let e = run("tls-require-client-cert = \"yes\"", &[]).expect_err("flag value");
        assert!(e.to_string().contains("takes no value"), "{e}");
        let e = run("data-dir = ", &[]).expect_err("toml");
        assert!(e.to_string().contains("not valid TOML"), "{e}");
        let missing = merge(
            vec![
                "fenced".into(),
                "serve".into(),
                "--config".into(),
                "/nonexistent/fenced.toml".into(),
            ],
            cli(),
        );
        assert!(matches!(missing, Err(ConfigFileError::Read { .. })));
    }
}
