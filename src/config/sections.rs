//! `[cloud.<name>]`: each cloud's own keys, which only its folder reads. The config knows no
//! cloud: it is handed the cloud boundary's list ([`Listed`]) to check `[cloud] provider`
//! against, hands each cloud its table as written, and keeps the configured cloud's
//! ([`Section`]) for it to read its settings from when it opens.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::ConfigError;
use crate::rules::Action;

/// What the config is told of one cloud on the cloud boundary's list: its name, and, where the
/// build holds it (each cloud is a cargo feature), its keys.
#[derive(Clone, Copy)]
pub struct Listed {
    /// `[cloud] provider`'s value and the section's name, `[cloud.<name>]`.
    pub name: &'static str,
    /// `None`: the cloud is on the list, but this build left it out.
    pub keys: Option<&'static CloudKeys>,
}

/// The cloud boundary's list, as the config reads it.
pub type Clouds<'a> = &'a [Listed];

/// Where a check gives each problem: the key as written, and what is wrong with it.
pub type Invalid<'a> = &'a mut dyn FnMut(&str, String);

/// One cloud's keys, as its folder describes them: made with [`CloudKeys::of`] from the serde
/// struct the cloud reads its section into.
#[derive(Debug)]
pub struct CloudKeys {
    /// Checks a section, giving each problem with the key as written; the second argument is
    /// `[cloud] provider`'s value.
    pub check: fn(&Section, &str, Invalid, &mut Vec<String>),
    /// The section with every key at its default (the example config shows them).
    pub defaults: fn() -> toml::Table,
    /// Keys the cloud once read from `[cloud]` itself: they still work there, for one release,
    /// with a warning that names their new place.
    pub moved: &'static [&'static str],
    /// What the cloud's plan refuses on every instance, and why: a rule or budget with that
    /// action is refused at load, in the plan's own words.
    pub refuses: fn(Action) -> Option<&'static str>,
    /// The budgets whose spend the cloud reads, where it has them.
    pub budgets: Option<BudgetSourceKeys>,
    /// The key of a topic of the cloud's that any budget's crossings may be published to.
    pub topic: Option<TopicKey>,
}

/// A budget source of a cloud's: `[[budgets]] source = "<source>"` reads the budget's spend and
/// limit from the cloud, with keys that only the cloud reads.
#[derive(Debug)]
pub struct BudgetSourceKeys {
    /// `source =`'s value, and the `source` label of `gpuwatch_budget_info`.
    pub source: &'static str,
    /// The keys a budget of this source may have besides every budget's.
    pub keys: &'static [&'static str],
    /// Checks a budget's keys of this source (`name` is the budget's name): each problem with
    /// its key alone.
    pub check: fn(name: &str, keys: &toml::Table, invalid: Invalid),
    /// An answer counts for two poll intervals, and at least this long.
    pub fresh_at_least: std::time::Duration,
}

/// A budget key that names a topic of the cloud's, which a crossing is published to.
#[derive(Debug)]
pub struct TopicKey {
    pub key: &'static str,
    /// Why a value is not such a topic, if it is not.
    pub check: fn(&str) -> Option<String>,
}

/// A cloud's settings struct: serde's, with its defaults, and checks of its values beyond
/// their types.
pub trait Keys: Default + Serialize + DeserializeOwned {
    /// Checks values that parsed: `key` names one as written, for `invalid`.
    fn check(&self, _key: &dyn Fn(&str) -> String, _invalid: &mut dyn FnMut(&str, String)) {}

    /// What the settings would do that does not happen where the node is on another cloud,
    /// said as a warning at load.
    fn unused(&self) -> Option<String> {
        None
    }

    /// Why `key = value`, still written in `[cloud]` itself, is wrong where `provider` is
    /// another cloud: it was meant for this one.
    fn misplaced(key: &str, value: &toml::Value, provider: &str) -> String {
        let _ = key;
        format!("{value} is a key of another cloud's, but provider = \"{provider}\"")
    }
}

impl CloudKeys {
    /// The keys of the settings struct `K`.
    pub const fn of<K: Keys>(
        moved: &'static [&'static str],
        refuses: fn(Action) -> Option<&'static str>,
    ) -> CloudKeys {
        CloudKeys {
            check: check::<K>,
            defaults: defaults::<K>,
            moved,
            refuses,
            budgets: None,
            topic: None,
        }
    }
}

impl PartialEq for CloudKeys {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

fn check<K: Keys>(section: &Section, provider: &str, invalid: Invalid, warnings: &mut Vec<String>) {
    let parsed = section.parse::<K>();
    match &parsed {
        Ok(keys) => keys.check(&|k| section.key(k), invalid),
        Err(e) => invalid(&e.0, e.1.clone()),
    }
    if section.name != provider {
        if let Some(why) = parsed.ok().and_then(|k| k.unused()) {
            warnings.push(why);
        }
        // A key written in `[cloud]` was meant for the cloud the node is on.
        let in_cloud = section.moved.iter().filter(|(_, t)| !t.is_empty());
        for key in in_cloud.map(|(k, _)| k) {
            let why = K::misplaced(key, &section.table[key.as_str()], provider);
            invalid(&section.key(key), why);
        }
    }
}

fn defaults<K: Keys>() -> toml::Table {
    toml::Table::try_from(K::default()).expect("a cloud's defaults serialize as a table")
}

/// One cloud's section as written: `[cloud.<name>]`, and any of its keys still written in
/// `[cloud]` itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Section {
    name: String,
    table: toml::Table,
    /// The keys of `table` written elsewhere, from before the cloud had its table, and the
    /// table they were written in (`cloud`, or the top level: "").
    moved: BTreeMap<String, &'static str>,
}

impl Section {
    /// The cloud's name (`none` where no cloud is configured).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A key of the section (`a.b` for one in a table of its) as the file names it:
    /// `cloud.<name>.<key>`, or where it was written from before the cloud had its table
    /// (`cloud.<key>`, or `<key>` at the top).
    pub fn key(&self, key: &str) -> String {
        let first = key.split('.').next().unwrap_or(key);
        match self.moved.get(first) {
            Some(&"") => key.to_string(),
            Some(table) => format!("{table}.{key}"),
            None => format!("cloud.{}.{key}", self.name),
        }
    }

    /// The section read into the cloud's settings struct, or the first problem, as its key and
    /// message.
    pub fn parse<K: Keys>(&self) -> Result<K, (String, String)> {
        parse_table(&self.table).map_err(|(key, message)| {
            let key = if key.is_empty() {
                format!("cloud.{}", self.name)
            } else {
                self.key(&key)
            };
            (key, message)
        })
    }

    /// The settings the cloud reads when it opens: its checked section, or, where no config
    /// checked it (the built-in defaults), the defaults.
    pub fn settings<K: Keys>(&self) -> K {
        self.parse().unwrap_or_default()
    }
}

/// A table of a cloud's keys read into its serde struct `T`, or the first problem: its key
/// (empty for the table itself) and what is wrong, in the words every config error uses.
pub fn parse_table<T: DeserializeOwned>(table: &toml::Table) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        let path = e.path().to_string();
        let key = path.trim_start_matches('.').to_string();
        // toml's own words, without the line it adds to name the key (named by the caller).
        let message = e.into_inner().to_string();
        let message = message
            .lines()
            .next()
            .unwrap_or_default()
            .replace('`', "\"");
        (key, super::check::unknown_key_message(message.trim()))
    })
}

/// Splits `[cloud]`'s keys that are not its own into the clouds' sections: each
/// `[cloud.<name>]` table is checked by the cloud it names, and each moved key goes, with a
/// warning, to the cloud that reads it. Returns the configured cloud's section.
pub(super) fn split(
    provider: &str,
    rest: &toml::Table,
    tables: &[(&str, &toml::Value)],
    clouds: Clouds,
    own: &[&str],
    invalid: Invalid,
    warnings: &mut Vec<String>,
) -> Section {
    let mut sections: Vec<Section> = Vec::new();
    // The tables first, then the keys written in `[cloud]` itself, whatever their order.
    let (tables_here, keys): (Vec<_>, Vec<_>) = rest.iter().partition(|(_, v)| v.is_table());
    for (key, value) in tables_here {
        match (value, clouds.iter().find(|c| c.name == key)) {
            (toml::Value::Table(table), Some(cloud)) => sections.push(Section {
                name: cloud.name.to_string(),
                table: table.clone(),
                moved: BTreeMap::new(),
            }),
            _ => {
                let names: Vec<String> = clouds.iter().map(|c| format!("\"{}\"", c.name)).collect();
                let why = format!(
                    "\"{key}\" is not a cloud gpuwatch knows; expected one of {}",
                    names.join(", ")
                );
                invalid(&format!("cloud.{key}"), why);
            }
        }
    }
    let written = keys.into_iter().map(|(k, v)| ("cloud", k.as_str(), v));
    let written = written.chain(tables.iter().map(|(k, v)| ("", *k, *v)));
    for (table, key, value) in written {
        let owner = clouds
            .iter()
            .find(|c| c.keys.is_some_and(|k| k.moved.contains(&key)));
        let Some(owner) = owner else {
            let expected: Vec<String> = (own.iter().copied())
                .chain(clouds.iter().map(|c| c.name))
                .map(|k| format!("\"{k}\""))
                .collect();
            let why = format!(
                "\"{key}\" is not a known key; expected one of {}",
                expected.join(", ")
            );
            invalid(&format!("cloud.{key}"), why);
            continue;
        };
        moved(
            &mut sections,
            owner.name,
            table,
            key,
            value,
            invalid,
            warnings,
        );
    }
    for section in &sections {
        let keys = clouds
            .iter()
            .find(|c| c.name == section.name)
            .and_then(|c| c.keys);
        // A cloud this build left out cannot read its keys: they are not read (and where the
        // provider names it, that is refused).
        if let Some(keys) = keys {
            (keys.check)(section, provider, invalid, warnings);
        }
    }
    sections
        .into_iter()
        .find(|s| s.name == provider)
        .unwrap_or_else(|| Section {
            name: provider.to_string(),
            ..Section::default()
        })
}

/// Puts `key = value`, written in `table` (`cloud`, or "" for the top level) from before the
/// cloud `name` had its own table, into that cloud's section, and says where it goes now.
fn moved(
    sections: &mut Vec<Section>,
    name: &str,
    table: &'static str,
    key: &str,
    value: &toml::Value,
    invalid: Invalid,
    warnings: &mut Vec<String>,
) {
    let written = if table.is_empty() {
        key.to_string()
    } else {
        format!("{table}.{key}")
    };
    if value.is_table() {
        warnings.push(format!(
            "[{written}] has moved to [cloud.{name}.{key}]: write it as that table (it is read from [{written}] for this release only)"
        ));
    } else {
        warnings.push(format!(
            "{written} has moved to [cloud.{name}]: write `{key} = {value}` under a [cloud.{name}] table (it is read from [{table}] for this release only)"
        ));
    }
    let at = sections.iter().position(|s| s.name == name);
    let at = at.unwrap_or_else(|| {
        sections.push(Section {
            name: name.to_string(),
            ..Section::default()
        });
        sections.len() - 1
    });
    let section = &mut sections[at];
    if section.table.contains_key(key) {
        let why = if value.is_table() {
            format!("is set as [cloud.{name}.{key}] too: write it there alone")
        } else {
            format!("{value} is set in [cloud.{name}] too: write it there alone")
        };
        invalid(&written, why);
    } else {
        section.table.insert(key.to_string(), value.clone());
        section.moved.insert(key.to_string(), table);
    }
}

/// The keys of a rule or budget that ask for an action the configured cloud's plan refuses on
/// every instance, with the plan's reason.
pub(super) fn refused(
    keys: Option<&CloudKeys>,
    actions: impl Iterator<Item = (String, String)>,
    errors: &mut Vec<ConfigError>,
) {
    let Some(keys) = keys else {
        return;
    };
    for (key, action) in actions {
        let named = Action::INSTANCE.iter().find(|a| a.as_str() == action);
        if let Some(why) = named.and_then(|a| (keys.refuses)(*a)) {
            errors.push(ConfigError::Invalid {
                key,
                message: why.to_string(),
            });
        }
    }
}
