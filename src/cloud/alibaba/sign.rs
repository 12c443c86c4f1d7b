//! Alibaba Cloud's request signature V3 (`ACS3-HMAC-SHA256`), as its "Request syntax and
//! signature method V3" document defines it: a canonical request (method, `/` for an RPC API,
//! the sorted and RFC 3986-encoded query, the `host`, `content-type` and `x-acs-*` headers,
//! their names, the body's SHA-256), its SHA-256 signed with HMAC-SHA256 under the
//! AccessKeySecret, and the `Authorization` header. Pure: the caller gives the date and nonce.

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

pub const ALGORITHM: &str = "ACS3-HMAC-SHA256";

/// One request to sign.
pub struct Request<'a> {
    pub method: &'a str,
    /// `/` for an RPC API such as ECS.
    pub path: &'a str,
    /// Query parameters, in any order.
    pub query: &'a [(String, String)],
    /// Headers to sign: `host`, `content-type` and every `x-acs-*` one, in any order and case.
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
}

/// What signing gives: the canonical request, the string signed, and the `Authorization`
/// header's value.
#[derive(Debug, PartialEq)]
pub struct Signed {
    pub canonical_request: String,
    pub string_to_sign: String,
    pub authorization: String,
}

/// Hex of SHA-256.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// RFC 3986 encoding: letters, digits and `-_.~` as they are, everything else `%XX` in upper
/// case (a space is `%20`, `*` is `%2A`).
pub fn encode(value: &str) -> String {
    crate::cloud::rest::encode(value)
}

/// The canonical query: names and values encoded, sorted by name (then value), `&`-joined.
pub fn canonical_query(query: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> =
        query.iter().map(|(k, v)| (encode(k), encode(v))).collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Signs `request` with the AccessKey `id` and `secret`.
pub fn sign(request: &Request<'_>, id: &str, secret: &str) -> Signed {
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .filter(|(k, _)| k == "host" || k == "content-type" || k.starts_with("x-acs-"))
        .collect();
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let path = request
        .path
        .split('/')
        .map(encode)
        .collect::<Vec<_>>()
        .join("/");
    let canonical_request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        request.method.to_ascii_uppercase(),
        if path.is_empty() {
            "/".to_string()
        } else {
            path
        },
        canonical_query(request.query),
        canonical_headers,
        signed_headers,
        sha256_hex(request.body)
    );
    let string_to_sign = format!("{ALGORITHM}\n{}", sha256_hex(canonical_request.as_bytes()));
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(string_to_sign.as_bytes());
    let signature = hex(&mac.finalize().into_bytes());
    Signed {
        authorization: format!(
            "{ALGORITHM} Credential={id},SignedHeaders={signed_headers},Signature={signature}"
        ),
        canonical_request,
        string_to_sign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The worked example of Alibaba Cloud's signature V3 document ("Fixed parameter values"):
    /// its inputs, and the canonical request, string to sign and signature it prints.
    #[test]
    fn the_documented_example_signs_as_the_document_says() {
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let headers = pairs(&[
            ("host", "ecs.cn-shanghai.aliyuncs.com"),
            ("x-acs-action", "RunInstances"),
            ("x-acs-version", "2014-05-26"),
            ("x-acs-date", "2023-10-26T10:22:32Z"),
            ("x-acs-signature-nonce", "3156853299f313e23d1673dc12e1703d"),
            ("x-acs-content-sha256", empty),
            // Not signed: neither host, content-type nor x-acs-*.
            ("accept", "application/json"),
        ]);
        let query = pairs(&[
            ("RegionId", "cn-shanghai"),
            (
                "ImageId",
                "win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd",
            ),
        ]);
        let signed = sign(
            &Request {
                method: "POST",
                path: "/",
                query: &query,
                headers: &headers,
                body: b"",
            },
            "YourAccessKeyId",
            "YourAccessKeySecret",
        );
        assert_eq!(
            signed.canonical_request,
            "POST\n/\nImageId=win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd&RegionId=cn-shanghai\n\
             host:ecs.cn-shanghai.aliyuncs.com\nx-acs-action:RunInstances\n\
             x-acs-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n\
             x-acs-date:2023-10-26T10:22:32Z\nx-acs-signature-nonce:3156853299f313e23d1673dc12e1703d\n\
             x-acs-version:2014-05-26\n\n\
             host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            signed.string_to_sign,
            "ACS3-HMAC-SHA256\n7ea06492da5221eba5297e897ce16e55f964061054b7695beedaac1145b1e259"
        );
        assert_eq!(
            signed.authorization,
            "ACS3-HMAC-SHA256 Credential=YourAccessKeyId,SignedHeaders=host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version,Signature=06563a9e1b43f5dfe96b81484da74bceab24a1d853912eee15083a6f0f3283c0"
        );
    }

    /// The document's encoding rules: a space is `%20`, `*` is `%2A`, `~` stays, and `:`, `"`,
    /// `[`, `,` are encoded; parameters sort by their encoded names, `Tag.10` before `Tag.2`.
    #[test]
    fn queries_are_encoded_and_sorted_as_the_document_says() {
        let q = pairs(&[
            ("Tag.2.Key", "b"),
            ("RegionId", "cn-hangzhou"),
            ("InstanceIds", r#"["i-abc","i-def"]"#),
            ("Tag.10.Key", "owner:team a*~"),
        ]);
        assert_eq!(
            canonical_query(&q),
            "InstanceIds=%5B%22i-abc%22%2C%22i-def%22%5D&RegionId=cn-hangzhou&Tag.10.Key=owner%3Ateam%20a%2A~&Tag.2.Key=b"
        );
        assert_eq!(canonical_query(&[]), "");
    }

    /// With an STS token, the token header is signed with the others, its value as it is.
    #[test]
    fn a_security_token_is_signed_and_values_are_trimmed_not_encoded() {
        let headers = pairs(&[
            ("Host", "ecs.cn-hangzhou.aliyuncs.com"),
            ("X-Acs-Security-Token", "  CAIS-test-token/+=  "),
        ]);
        let signed = sign(
            &Request {
                method: "post",
                path: "/",
                query: &[],
                headers: &headers,
                body: b"",
            },
            "STS.NTestAccessKeyId",
            "TestAccessKeySecret",
        );
        assert!(signed
            .canonical_request
            .contains("\nx-acs-security-token:CAIS-test-token/+=\n\nhost;x-acs-security-token\n"));
        assert!(signed.canonical_request.starts_with("POST\n/\n\nhost:"));
        assert!(signed
            .authorization
            .starts_with("ACS3-HMAC-SHA256 Credential=STS.NTestAccessKeyId,SignedHeaders=host;x-acs-security-token,Signature="));
    }

    /// A StopInstance call with an STS token, parameters in the query as the ECS SDKs send
    /// them: the signature computed by hand with the document's algorithm (not printed in the
    /// document itself).
    #[test]
    fn a_stop_with_an_sts_token_signs_as_computed_by_hand() {
        let empty = sha256_hex(b"");
        let headers = pairs(&[
            ("host", "ecs.cn-hangzhou.aliyuncs.com"),
            ("x-acs-action", "StopInstance"),
            ("x-acs-version", "2014-05-26"),
            ("x-acs-date", "2024-01-02T03:04:05Z"),
            ("x-acs-signature-nonce", "0123456789abcdef0123456789abcdef"),
            ("x-acs-content-sha256", &empty),
            ("x-acs-security-token", "CAIS-test-token/+="),
        ]);
        let query = pairs(&[
            ("InstanceId", "i-bp67acfmxazb4ph****"),
            ("StoppedMode", "StopCharging"),
            ("ForceStop", "false"),
        ]);
        let signed = sign(
            &Request {
                method: "POST",
                path: "/",
                query: &query,
                headers: &headers,
                body: b"",
            },
            "STS.NTestAccessKeyId",
            "TestAccessKeySecret",
        );
        assert_eq!(
            signed.string_to_sign,
            "ACS3-HMAC-SHA256\nb972a54258f4ed92fb15632cc411cc7aa41ae32cbff271d829c25c6a966ed7e1"
        );
        assert!(signed.authorization.ends_with(
            ",Signature=f621793b32032fd99275ff19342fcfb6e90cc372bb1b51ae1503dd4245e0e64b"
        ));
    }
}
