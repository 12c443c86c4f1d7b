//! Keeps secrets out of logs and audit records. A webhook URL is a credential (a Slack
//! incoming-webhook URL lets anyone post), and HTTP clients put the URL in their error text.

/// Text from outside (GPU and process names, tags, reasons, an error body) made safe for a
/// terminal: control characters, escape sequences' start among them, become U+FFFD.
pub fn plain(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// Text from outside, made plain, and cut to at most `max` bytes (at a character boundary),
/// with `…` where it was cut: an error body in a message.
pub fn brief(text: &str, max: usize) -> String {
    let mut text = plain(text);
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// Replaces the userinfo, path, query and fragment of every `http://` or `https://` URL in
/// `text` with `…`, keeping the scheme and host so that a person can still tell which
/// endpoint failed.
pub fn urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = find_scheme(rest) {
        let (before, url) = rest.split_at(start);
        out.push_str(before);
        let scheme_len = if url.starts_with("https://") { 8 } else { 7 };
        let end = url
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | '>' | ','))
            .unwrap_or(url.len());
        let (whole, tail) = url.split_at(end);
        let after_scheme = &whole[scheme_len..];
        let authority_end = after_scheme
            .find(['/', '?', '#'])
            .unwrap_or(after_scheme.len());
        let authority = &after_scheme[..authority_end];
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        out.push_str(&whole[..scheme_len]);
        out.push_str(host);
        if authority_end < after_scheme.len() || host.len() < authority.len() {
            out.push_str("/…");
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// The credentials the daemon holds (a cloud's tokens, keys and secrets), each registered as it
/// is fetched, so that [`scrub`] can take them out of text from outside: a cloud's error may
/// quote what it was sent. The newest `HELD_MAX` are kept.
static HELD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
const HELD_MAX: usize = 32;

/// Registers a credential the daemon now holds; one shorter than 8 bytes is no secret worth the
/// name, and is left alone (it would scrub ordinary words).
pub fn hold_secret(secret: &str) {
    if secret.len() < 8 {
        return;
    }
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if held.iter().any(|s| s == secret) {
        return;
    }
    if held.len() >= HELD_MAX {
        held.remove(0);
    }
    held.push(secret.to_string());
}

/// `text` with every credential the daemon holds (see [`hold_secret`]) replaced by
/// `[redacted]`, and every URL's path and query taken out ([`urls`]).
pub fn scrub(text: &str) -> String {
    let mut out = urls(text);
    let held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    // The longest first: a secret that holds another is taken out whole.
    let mut secrets: Vec<&String> = held.iter().collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "[redacted]");
        }
    }
    out
}

fn find_scheme(text: &str) -> Option<usize> {
    let lower = text.to_ascii_lowercase();
    [lower.find("https://"), lower.find("http://")]
        .into_iter()
        .flatten()
        .min()
}

#[cfg(test)]
mod tests {
    use super::{hold_secret, scrub, urls};

    #[test]
    fn secrets_in_urls_are_redacted() {
        let cases = [
            (
                "error sending request for url (https://hooks.slack.com/services/T000/B000/XXXX)",
                "error sending request for url (https://hooks.slack.com/…)",
            ),
            (
                "http://user:hunter2@example.com:8080/hook?token=abc failed",
                "http://example.com:8080/… failed",
            ),
            ("http://127.0.0.1:9400", "http://127.0.0.1:9400"),
            ("no url here", "no url here"),
            (
                "two: https://a.example/x and HTTP://b.example/y?z",
                "two: https://a.example/… and HTTP://b.example/…",
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(urls(raw), want, "{raw}");
        }
    }

    #[test]
    fn credentials_held_are_scrubbed_from_any_text() {
        let secret = "STS.NTestOnlyKey0123456789abcdef";
        let token = "CAISTestOnlyToken+/0123456789==";
        hold_secret(secret);
        hold_secret(token);
        hold_secret("short");
        let said = format!(
            "InvalidParameter: the AccessKeyId {secret} with token {token} at https://api.example/?Token={token} is short"
        );
        let scrubbed = scrub(&said);
        assert!(!scrubbed.contains(secret), "{scrubbed}");
        assert!(!scrubbed.contains(token), "{scrubbed}");
        assert!(
            scrubbed.contains("the AccessKeyId [redacted] with token [redacted]"),
            "{scrubbed}"
        );
        assert!(scrubbed.ends_with("is short"), "{scrubbed}");
        assert_eq!(scrub("nothing held here"), "nothing held here");
    }
}
