//! The shipped Grafana dashboards as the tests read them: every query of every panel (the
//! panels of rows included, collapsed or not), of every annotation and of every query variable,
//! and Grafana's template variables substituted in them.

use std::path::Path;

use serde_json::Value;

/// What a query feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Panel,
    Annotation,
    /// A query variable: `label_values(SELECTOR, LABEL)`.
    Variable,
}

/// One query of a dashboard, and where it is.
#[derive(Debug, Clone)]
pub struct Query {
    /// The dashboard's file name.
    pub dashboard: String,
    pub kind: Kind,
    /// The panel's title; "annotation NAME" or "variable NAME" for those.
    pub panel: String,
    /// The title of the row the panel is in, if any.
    pub row: Option<String>,
    pub expr: String,
    /// Grafana runs it as an instant query (at the end of the time range), else over the range.
    pub instant: bool,
}

/// The dashboard in this file.
pub fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names of the dashboard's template variables.
pub fn variables(dash: &Value) -> Vec<String> {
    dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(String::from))
        .collect()
}

/// Every query of the dashboard: its panels' targets (a row's own panels count as in that row;
/// so do the panels that follow an expanded row), its Prometheus annotations, and its query
/// variables (as written: `label_values(SELECTOR, LABEL)`).
pub fn queries(path: &Path) -> Vec<Query> {
    let dash = load(path);
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let mut out = Vec::new();
    let mut row: Option<String> = None;
    for panel in dash["panels"].as_array().into_iter().flatten() {
        if panel["type"] == "row" {
            row = panel["title"].as_str().map(String::from);
            for inner in panel["panels"].as_array().into_iter().flatten() {
                panel_queries(&name, inner, &row, &mut out);
            }
        } else {
            panel_queries(&name, panel, &row, &mut out);
        }
    }
    for a in dash["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(expr) = a["expr"].as_str() {
            out.push(Query {
                dashboard: name.clone(),
                kind: Kind::Annotation,
                panel: format!("annotation {}", a["name"].as_str().unwrap_or("")),
                row: None,
                expr: expr.to_string(),
                instant: false,
            });
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] == "query" {
            let q = v["query"]["query"].as_str().or_else(|| v["query"].as_str());
            out.push(Query {
                dashboard: name.clone(),
                kind: Kind::Variable,
                panel: format!("variable {}", v["name"].as_str().unwrap_or("")),
                row: None,
                expr: q.unwrap_or_default().to_string(),
                instant: true,
            });
        }
    }
    out
}

fn panel_queries(dashboard: &str, panel: &Value, row: &Option<String>, out: &mut Vec<Query>) {
    let title = panel["title"].as_str().unwrap_or("").to_string();
    let targets = panel["targets"].as_array();
    assert!(
        targets.is_some_and(|t| !t.is_empty()),
        "{dashboard}: panel {title:?} has no queries"
    );
    for t in targets.into_iter().flatten() {
        let expr = t["expr"].as_str().unwrap_or_else(|| {
            panic!("{dashboard}: panel {title:?} has a target without an expr: {t}")
        });
        out.push(Query {
            dashboard: dashboard.to_string(),
            kind: Kind::Panel,
            panel: title.clone(),
            row: row.clone(),
            expr: expr.to_string(),
            instant: t["instant"] == true,
        });
    }
}

/// The expression with each template variable (`$name`, `${name}`, `${name:format}`) replaced
/// by its value in `vars`; a variable not there fails the test, naming it.
pub fn substitute(expr: &str, vars: &[(&str, &str)]) -> String {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {expr}"));
            let inner = &braced[..end];
            (inner.split(':').next().unwrap(), &braced[end + 1..])
        } else {
            let end = after.find(|c: char| !ident(c)).unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        assert!(!name.is_empty(), "a lone $ in {expr}");
        let value = vars
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("${name} has no value (in {expr})"))
            .1;
        out.push_str(value);
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// `label_values(SELECTOR, LABEL)` as (SELECTOR, LABEL); `None` for any other variable query.
pub fn label_values(query: &str) -> Option<(&str, &str)> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim(), label.trim()))
}
