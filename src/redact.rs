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

fn find_scheme(text: &str) -> Option<usize> {
    let lower = text.to_ascii_lowercase();
    [lower.find("https://"), lower.find("http://")]
        .into_iter()
        .flatten()
        .min()
}

#[cfg(test)]
mod tests {
    use super::urls;

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
}
