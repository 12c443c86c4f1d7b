//! NVIDIA's XID catalog, as data: for each XID code, what it means, whom the catalog blames, and
//! the action it recommends. The table is `xids.csv`, one line per code; this module reads it
//! once and answers lookups.

use std::sync::OnceLock;

use serde::Serialize;

/// What the catalog recommends doing about an XID (or gpuwatch about a problem).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    None,
    RestartApp,
    ResetGpu,
    RebootNode,
    ReportHardware,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "none",
            Action::RestartApp => "restart_app",
            Action::ResetGpu => "reset_gpu",
            Action::RebootNode => "reboot_node",
            Action::ReportHardware => "report_hardware",
        }
    }

    /// The action in words, for people.
    pub fn words(self) -> &'static str {
        match self {
            Action::None => "no action",
            Action::RestartApp => "restart the application",
            Action::ResetGpu => "reset the GPU",
            Action::RebootNode => "reboot the node",
            Action::ReportHardware => "report the hardware",
        }
    }

    /// The action a label value (`reset_gpu`) names.
    pub fn parse(s: &str) -> Option<Action> {
        [
            Action::None,
            Action::RestartApp,
            Action::ResetGpu,
            Action::RebootNode,
            Action::ReportHardware,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// Whom the catalog blames for an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Blame {
    Application,
    Driver,
    Hardware,
    System,
    Unknown,
}

impl Blame {
    fn parse(s: &str) -> Option<Blame> {
        Some(match s {
            "application" => Blame::Application,
            "driver" => Blame::Driver,
            "hardware" => Blame::Hardware,
            "system" => Blame::System,
            "unknown" => Blame::Unknown,
            _ => return None,
        })
    }
}

/// One code of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Xid {
    pub code: u64,
    pub action: Action,
    pub blame: Blame,
    pub meaning: &'static str,
}

impl Xid {
    /// Whether the XID makes its GPU unhealthy until it is reset: the catalog says it needs a
    /// reset or a reboot, or points to the hardware, and does not blame the application. An
    /// application's own errors (13, 31, 43, 45 and their kind) are counted, not held against
    /// the GPU.
    pub fn makes_unhealthy(&self) -> bool {
        self.blame != Blame::Application
            && matches!(
                self.action,
                Action::ResetGpu | Action::RebootNode | Action::ReportHardware
            )
    }
}

const CSV: &str = include_str!("xids.csv");

/// The catalog's entry for `code`; `None` for a code it does not list.
pub fn xid(code: u64) -> Option<&'static Xid> {
    let all = catalog();
    all.binary_search_by_key(&code, |x| x.code)
        .ok()
        .map(|i| &all[i])
}

/// Every code, in order.
pub fn catalog() -> &'static [Xid] {
    static ALL: OnceLock<Vec<Xid>> = OnceLock::new();
    ALL.get_or_init(|| parse(CSV).unwrap_or_else(|e| panic!("xids.csv: {e}")))
}

/// Parses the catalog: comment lines, the header, then `code,action,blame,meaning` in
/// increasing code order.
fn parse(text: &'static str) -> Result<Vec<Xid>, String> {
    let mut out: Vec<Xid> = Vec::new();
    let mut header = false;
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if !header {
            if line != "code,action,blame,meaning" {
                return Err(format!("line {n}: expected the header, found {line:?}"));
            }
            header = true;
            continue;
        }
        let cols: Vec<&'static str> = line.splitn(4, ',').collect();
        let [code, action, blame, meaning] = cols[..] else {
            return Err(format!("line {n}: expected 4 columns: {line:?}"));
        };
        let code: u64 = code
            .parse()
            .map_err(|_| format!("line {n}: {code:?} is not an XID"))?;
        if out.last().is_some_and(|x| x.code >= code) {
            return Err(format!("line {n}: XID {code} is out of order or repeated"));
        }
        if meaning.is_empty() || meaning.contains(',') {
            return Err(format!("line {n}: the meaning is empty or has a comma"));
        }
        out.push(Xid {
            code,
            action: Action::parse(action)
                .ok_or_else(|| format!("line {n}: {action:?} is not an action"))?,
            blame: Blame::parse(blame)
                .ok_or_else(|| format!("line {n}: {blame:?} is not a blame"))?,
            meaning,
        });
    }
    if !header {
        return Err("no header".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
