//! Config fixtures: every valid file loads, every invalid one gives exactly its `.err` text and
//! exit status 64.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuwatch::config::{Config, RawConfig};

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let files = common::files_in(&format!("tests/data/config/{kind}"), "toml");
    assert!(!files.is_empty());
    files
}

#[test]
fn invalid_fixtures_give_their_exact_errors() {
    for path in fixtures("invalid") {
        let want = std::fs::read_to_string(path.with_extension("err"))
            .unwrap()
            .replace("{path}", &path.display().to_string());
        let got = gpuwatch::cloud::load_config(&path).expect_err(&path.display().to_string());
        assert_eq!(format!("{got}\n"), want, "{}", path.display());
    }
}

#[test]
fn valid_fixtures_load() {
    for path in fixtures("valid") {
        gpuwatch::cloud::load_config(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    for shipped in ["config/gpuwatch.toml", "config/aws-spot.toml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(shipped);
        gpuwatch::cloud::load_config(&path).unwrap_or_else(|e| panic!("{shipped}: {e}"));
    }
    let full = gpuwatch::cloud::load_config(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/config/valid/full.toml")
            .as_path(),
    )
    .unwrap();
    assert_eq!(full.server.listen.to_string(), "127.0.0.1:9500");
    assert_eq!(
        full.sampling.interval,
        std::time::Duration::from_millis(250)
    );
    assert!(full.sampling.per_process_memory);
}

#[test]
fn check_config_exits_64_with_the_message_and_0_when_valid() {
    for path in fixtures("invalid") {
        let out = Command::new(common::BIN)
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{}", path.display());
        let want = std::fs::read_to_string(path.with_extension("err"))
            .unwrap()
            .replace("{path}", &path.display().to_string());
        assert_eq!(String::from_utf8_lossy(&out.stderr), want);
    }
    let ok = Command::new(common::BIN)
        .arg("check-config")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/gpuwatch.toml"))
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
}

#[test]
fn run_with_bad_config_exits_64_before_serving() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/config/invalid/listen_no_port.toml");
    let out = Command::new(common::BIN)
        .arg("run")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.listen: \"localhost\""));
    let missing = Command::new(common::BIN)
        .args(["run", "--config", "/nonexistent/gpuwatch.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&missing.stderr)
        .contains("config: /nonexistent/gpuwatch.toml: cannot read"));
}

/// The shipped example sets every key, each to its default.
#[test]
fn example_config_is_every_key_at_its_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/gpuwatch.toml");
    let mut loaded = gpuwatch::cloud::load_config(&path).unwrap();
    assert_eq!(loaded.path, path);
    loaded.path = Default::default();
    assert_eq!(loaded, Config::default());

    let text = std::fs::read_to_string(&path).unwrap();
    let example: toml::Value = toml::from_str(&text).unwrap();
    let mut defaults = toml::Value::try_from(RawConfig::default()).unwrap();
    // Each cloud's table, with its keys at their defaults, where it has any.
    for listed in gpuwatch::cloud::listed() {
        let keys = (listed.keys.unwrap().defaults)();
        if !keys.is_empty() {
            defaults["cloud"]
                .as_table_mut()
                .unwrap()
                .insert(listed.name.into(), keys.into());
        }
    }
    assert_eq!(
        keys(&example, ""),
        keys(&defaults, ""),
        "config/gpuwatch.toml drifted from the defaults"
    );
    assert_eq!(example, defaults);
}

fn keys(v: &toml::Value, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let toml::Value::Table(t) = v {
        for (k, v) in t {
            let key = format!("{prefix}{k}");
            out.extend(keys(v, &format!("{key}.")));
            out.push(key);
        }
    }
    out.sort();
    out
}

/// Inputs that once passed `check-config` and then hung, overflowed or aborted the daemon.
#[test]
fn unbounded_inputs_are_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, text: &str| -> (Option<i32>, String) {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = Command::new(common::BIN)
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A rules file that never ends is not read at all: it is no regular file.
    let (code, err) = check("zero.toml", "rules_file = \"/dev/zero\"\n");
    assert_eq!(code, Some(64));
    assert!(
        err.contains("/dev/zero: cannot read: is a character device, not a regular file"),
        "{err}"
    );
    // A regular one that is too large is refused by its size.
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    let (code, err) = check(
        "big-rules.toml",
        &format!("rules_file = \"{}\"\n", big.display()),
    );
    assert_eq!(code, Some(64));
    assert!(
        err.contains("big.toml: cannot read: is larger than 4 MiB"),
        "{err}"
    );

    // The JSON rule form goes through the same bounds.
    let json = dir.path().join("rules.json");
    std::fs::write(
        &json,
        r#"{"Rules": [{"Description": "huge", "Actions": [{"Type": "Alert"}],
            "Trigger": {"Metric": "GPUUtilization", "Comparison": "LessThan", "Threshold": 5,
                        "Period": 60, "EvaluationPeriods": 4294967295}}]}"#,
    )
    .unwrap();
    let (code, err) = check(
        "json.toml",
        &format!("rules_file = {:?}\n", json.display().to_string()),
    );
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("evaluation_periods: \"4294967295\" must be between 1 and 10080"),
        "{err}"
    );
}

/// A budget gate must name a `[[budgets]]` entry wherever its rule comes from: `[[rules]]`, a
/// `rules_file`, or `--rules PATH`.
#[test]
fn a_budget_gate_names_a_budget_whichever_file_the_rule_is_in() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("more.toml");
    std::fs::write(
        &rules,
        "[[rules]]\nname = \"gated\"\nmetric = \"gpu_utilization\"\ncomparison = \"less_than\"\n\
         threshold = 0.05\nperiod = \"1h\"\nevaluation_periods = 2\naction = \"alert\"\n\
         budget = { name = \"nowhere\", spent_at_least = 0.8 }\n",
    )
    .unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(&config, "[[budgets]]\nname = \"team\"\nlimit_usd = 100.0\n").unwrap();
    let want = "rules[0].budget.name: \"nowhere\" is not the name of a [[budgets]] entry";
    // Through --rules.
    let mut loaded = gpuwatch::cloud::load_config(&config).unwrap();
    let err = loaded.add_rules_file(&rules).unwrap_err().to_string();
    assert!(err.contains(want), "{err}");
    // Through rules_file.
    std::fs::write(
        &config,
        "rules_file = \"more.toml\"\n[[budgets]]\nname = \"team\"\nlimit_usd = 100.0\n",
    )
    .unwrap();
    let err = gpuwatch::cloud::load_config(&config)
        .unwrap_err()
        .to_string();
    assert!(err.contains(want), "{err}");
    // And simulate refuses it with exit 64.
    std::fs::write(dir.path().join("empty.csv"), "").unwrap();
    let out = Command::new(common::BIN)
        .args(["simulate", "--trace"])
        .arg(dir.path().join("empty.csv"))
        .arg("--config")
        .arg(dir.path().join("gpuwatch.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains(want));
}

/// The webhook URL, a secret, may live in a file of its own: relative to the config, or in
/// systemd's credentials directory. A bad one is refused without quoting it.
#[test]
fn the_webhook_url_can_come_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuwatch.toml");
    let write = |text: &str| std::fs::write(&config, text).unwrap();
    std::fs::write(
        dir.path().join("webhook-url"),
        "https://hooks.example/T0/SECRET\n",
    )
    .unwrap();
    write("[actions]\nwebhook_url_file = \"webhook-url\"\n");
    let c = gpuwatch::cloud::load_config(&config).unwrap();
    assert_eq!(
        c.actions.webhook_url.as_deref(),
        Some("https://hooks.example/T0/SECRET")
    );
    // Through a credential, as the systemd unit would give it.
    let check = |env: Option<&std::path::Path>| {
        let mut cmd = Command::new(common::BIN);
        cmd.arg("check-config").arg(&config);
        match env {
            Some(d) => cmd.env("CREDENTIALS_DIRECTORY", d),
            None => cmd.env_remove("CREDENTIALS_DIRECTORY"),
        };
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    write("[actions]\nwebhook_url_file = \"${CREDENTIALS_DIRECTORY}/webhook-url\"\n");
    assert_eq!(check(Some(dir.path())).0, Some(0));
    // Outside the unit (an operator's `gpuwatch hold`), the same name is read beside the
    // config, where the credential comes from.
    let (code, err) = check(None);
    assert_eq!(code, Some(0), "{err}");
    let elsewhere = tempfile::tempdir().unwrap();
    let (code, err) = check(Some(elsewhere.path()));
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("webhook-url: cannot read"), "{err}");
    // Not both; and a file that holds no URL is named, its contents never shown.
    write("[actions]\nwebhook_url = \"https://a.example/\"\nwebhook_url_file = \"webhook-url\"\n");
    assert!(check(None).1.contains("not both"));
    std::fs::write(dir.path().join("webhook-url"), "not a url SECRET\n").unwrap();
    write("[actions]\nwebhook_url_file = \"webhook-url\"\n");
    let (code, err) = check(None);
    assert_eq!(code, Some(64));
    assert!(
        err.contains("webhook-url: holds no http:// or https:// URL"),
        "{err}"
    );
    assert!(!err.contains("SECRET"), "{err}");
}

/// A config whose main file, rules file, web config and webhook URL file are each wrong gets
/// every problem in one report (exit 64), main file first: an operator fixes them in one pass,
/// not one per run.
#[test]
fn every_files_problems_are_reported_at_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.toml"),
        "[[rules]]\nname = \"r\"\nmetric = \"gpu_utilization\"\ncomparison = \"sideways\"\n\
         threshold = 0.05\nperiod = \"1h\"\nevaluation_periods = 2\naction = \"alert\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("web.yml"), "basic_auth_users: 7\n").unwrap();
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        "rules_file = \"rules.toml\"\n[sampling]\ninterval = \"0s\"\n\
         [server]\nweb_config_file = \"web.yml\"\n\
         [actions]\nwebhook_url_file = \"no-such-file\"\n",
    )
    .unwrap();
    let out = Command::new(common::BIN)
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    let at = |needle: &str| {
        err.find(needle)
            .unwrap_or_else(|| panic!("no \"{needle}\" in:\n{err}"))
    };
    let main = at("sampling.interval: \"0s\" is too short");
    let rules = at("\"sideways\"");
    let web = at("server.web_config_file");
    // The key the YAML parser names is given once.
    assert!(
        err.contains("web.yml: basic_auth_users: invalid type"),
        "{err}"
    );
    let webhook = at("no-such-file");
    assert!(main < rules && rules < web && web < webhook, "{err}");
    // Each file fixed in turn: the others' problems stay.
    std::fs::write(
        &config,
        "rules_file = \"rules.toml\"\n[server]\nweb_config_file = \"web.yml\"\n",
    )
    .unwrap();
    let err = gpuwatch::cloud::load_config(&config)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"sideways\"") && err.contains("server.web_config_file"),
        "{err}"
    );
    assert!(!err.contains("sampling.interval"), "{err}");
}

/// A cloud's key written in `[cloud]` itself, from before the cloud had a table, still works
/// for one release: it is read as if it were in the table, and `check-config` says where it
/// goes now. Written in the table, it loads without a word.
#[test]
fn a_cloud_s_key_left_in_cloud_works_and_says_where_it_goes_now() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.toml");
    std::fs::write(
        &old,
        "[cloud]\nprovider = \"alibaba\"\nkeep_charging = true\nram_role = \"GpuRole\"\n",
    )
    .unwrap();
    let new = dir.path().join("new.toml");
    std::fs::write(
        &new,
        "[cloud]\nprovider = \"alibaba\"\n[cloud.alibaba]\nkeep_charging = true\nram_role = \"GpuRole\"\n",
    )
    .unwrap();
    let read = |path: &Path| {
        let config = gpuwatch::cloud::load_config(path).unwrap();
        let settings: gpuwatch::cloud::alibaba::settings::Settings =
            config.cloud.section.settings();
        (settings.keep_charging, settings.ram_role, config.warnings)
    };
    let (keep, role, warnings) = read(&old);
    assert!(keep);
    assert_eq!(role, "GpuRole");
    assert_eq!(
        warnings,
        [
            "cloud.keep_charging has moved to [cloud.alibaba]: write `keep_charging = true` under a [cloud.alibaba] table (it is read from [cloud] for this release only)",
            "cloud.ram_role has moved to [cloud.alibaba]: write `ram_role = \"GpuRole\"` under a [cloud.alibaba] table (it is read from [cloud] for this release only)",
        ]
    );
    assert_eq!(read(&new), (true, "GpuRole".to_string(), Vec::new()));

    let check = |path: &Path| {
        let out = Command::new(common::BIN)
            .arg("check-config")
            .arg(path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = check(&old);
    assert!(
        said.contains(&format!(
            "config: {}: warning: cloud.keep_charging has moved to [cloud.alibaba]: write `keep_charging = true`",
            old.display()
        )),
        "{said}"
    );
    assert_eq!(check(&new), "");
}

/// CloudWatch publishing is EC2's: `[cloud.aws.cloudwatch]`. A `[cloudwatch]` table from before
/// still works for one release, with a warning that says where it goes now, and its keys are
/// checked and named where they are written; enabled on a node of no cloud, it says that
/// nothing is published.
#[test]
fn cloudwatch_s_old_table_works_and_says_where_it_goes_now() {
    let parse = |text: &str| gpuwatch::cloud::parse_config(text, Path::new("t.toml"));
    let old = parse("[cloudwatch]\nenabled = true\ninterval = \"10s\"\n").unwrap();
    assert_eq!(
        old.warnings,
        [
            "[cloudwatch] has moved to [cloud.aws.cloudwatch]: write it as that table (it is read from [cloudwatch] for this release only)",
            "CloudWatch publishing is enabled, but provider is not \"aws\": nothing is published",
        ]
    );
    let on_aws =
        parse("[cloud]\nprovider = \"aws\"\n[cloud.aws.cloudwatch]\nenabled = true\n").unwrap();
    assert_eq!(on_aws.warnings, Vec::<String>::new());
    let settings: gpuwatch::cloud::aws::settings::Settings = on_aws.cloud.section.settings();
    assert!(settings.cloudwatch.enabled);
    let bad = |text: &str| parse(text).unwrap_err().to_string();
    assert_eq!(
        bad("[cloudwatch]\nnamespace = \"AWS/EC2\"\n"),
        "config: cloudwatch.namespace: \"AWS/EC2\" is not a namespace of your own, such as \"gpuwatch\""
    );
    assert_eq!(
        bad("[cloud.aws.cloudwatch]\ninterval = \"0s\"\n"),
        "config: cloud.aws.cloudwatch.interval: \"0s\" is too short; the least is \"1s\""
    );
    assert_eq!(
        bad("[cloudwatch]\nenabled = true\n[cloud.aws.cloudwatch]\nenabled = true\n"),
        "config: cloudwatch: is set as [cloud.aws.cloudwatch] too: write it there alone"
    );
}
