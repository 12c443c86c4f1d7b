//! The EC2 calls gpuwatch makes, and nothing else. `services::IAM_ACTIONS` and
//! `config/iam-policy.json` list the same operations; a test keeps them in step.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::operation::RequestId;
use aws_sdk_ec2::types::{Filter, SpotInstanceType, Tag};

use super::services::Shared;
use crate::cloud::{CloudError, ErrorKind};

fn classify<E: ProvideErrorMetadata + std::error::Error + 'static>(
    operation: &'static str,
    err: SdkError<E>,
) -> CloudError {
    let (kind, message, request_id) = match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => (
            ErrorKind::Retryable,
            aws_sdk_ec2::error::DisplayErrorContext(&err).to_string(),
            None,
        ),
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            let code = err.code().unwrap_or("");
            let kind = if status >= 500
                || code.contains("Throttl")
                || code == "RequestLimitExceeded"
                || code == "ServiceUnavailable"
                || code == "InternalError"
            {
                ErrorKind::Retryable
            } else if code == "TagLimitExceeded" {
                // The instance has EC2's 50 tags: the tags are refused, not the instance.
                ErrorKind::Limit
            } else if code == "UnauthorizedOperation"
                || code == "AuthFailure"
                || code.starts_with("AccessDenied")
                || status == 401
                || status == 403
            {
                ErrorKind::AccessDenied
            } else {
                ErrorKind::Other
            };
            let message = format!(
                "{} (HTTP {status}): {}",
                if code.is_empty() { "error" } else { code },
                err.message().unwrap_or("no message")
            );
            (kind, message, err.request_id().map(str::to_string))
        }
        _ => (
            ErrorKind::Other,
            aws_sdk_ec2::error::DisplayErrorContext(&err).to_string(),
            None,
        ),
    };
    CloudError {
        operation,
        kind,
        message,
        request_id,
        retry_after: None,
    }
}

pub use super::plan::SpotRequest;

/// The instance `id` among an answer's reservations.
fn named<'a>(
    reservations: &'a [aws_sdk_ec2::types::Reservation],
    id: &str,
) -> Option<&'a aws_sdk_ec2::types::Instance> {
    reservations
        .iter()
        .flat_map(|r| r.instances())
        .find(|i| i.instance_id() == Some(id))
}

/// The EC2 API, for this one instance.
/// The client is made on the first call (see [`Shared`]).
#[derive(Clone)]
pub struct Ec2 {
    shared: Shared,
    client: Arc<tokio::sync::OnceCell<aws_sdk_ec2::Client>>,
    pub instance_id: String,
}

impl Ec2 {
    /// An EC2 client of the shared SDK configuration (the default credential chain, which is the
    /// instance role on EC2; tests give static credentials), made on its first call.
    pub fn new(shared: &Shared, instance_id: &str) -> Ec2 {
        Ec2 {
            shared: shared.clone(),
            client: Arc::default(),
            instance_id: instance_id.to_string(),
        }
    }

    /// Retries are gpuwatch's own (see `actions`), so the SDK makes one attempt per call.
    async fn client(&self) -> &aws_sdk_ec2::Client {
        let shared = self.shared.get().await;
        self.client
            .get_or_init(|| async { aws_sdk_ec2::Client::from_conf(Ec2::config(shared)) })
            .await
    }

    fn config(shared: &aws_config::SdkConfig) -> aws_sdk_ec2::Config {
        aws_sdk_ec2::config::Builder::from(shared)
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(30))
                    .connect_timeout(Duration::from_secs(5))
                    .build(),
            )
            .build()
    }

    /// This instance, as DescribeInstances tells it: `None` when the answer does not name it.
    async fn describe(&self) -> Result<Option<aws_sdk_ec2::types::Instance>, CloudError> {
        let out = self
            .client()
            .await
            .describe_instances()
            .instance_ids(&self.instance_id)
            .send()
            .await
            .map_err(|e| classify("DescribeInstances", e))?;
        Ok(named(out.reservations(), &self.instance_id).cloned())
    }

    /// The instance's tags, read from the API (IMDS tags may be off). An answer that does not
    /// name the instance says nothing of its tags: an error worth retrying, never "no tags".
    pub async fn tags(&self) -> Result<Vec<(String, String)>, CloudError> {
        let instance = self.describe().await?.ok_or_else(|| CloudError {
            operation: "DescribeInstances",
            kind: ErrorKind::Retryable,
            message: format!(
                "the answer does not name {} (an eventually consistent read): its tags are unknown",
                self.instance_id
            ),
            request_id: None,
            retry_after: None,
        })?;
        Ok(instance
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
            .collect())
    }

    /// The instance's state name (running, stopping, stopped, shutting-down, terminated).
    pub async fn state(&self) -> Result<Option<String>, CloudError> {
        Ok(self
            .describe()
            .await?
            .and_then(|i| i.state()?.name().map(|n| n.as_str().to_string())))
    }

    /// The spot request that launched this instance, if one did and it is still open.
    pub async fn spot_request(&self) -> Result<Option<SpotRequest>, CloudError> {
        let out = self
            .client()
            .await
            .describe_spot_instance_requests()
            .filters(
                Filter::builder()
                    .name("instance-id")
                    .values(&self.instance_id)
                    .build(),
            )
            .send()
            .await
            .map_err(|e| classify("DescribeSpotInstanceRequests", e))?;
        Ok(out
            .spot_instance_requests()
            .iter()
            .filter(|r| r.instance_id() == Some(self.instance_id.as_str()))
            .find_map(|r| {
                Some(SpotRequest {
                    id: r.spot_instance_request_id()?.to_string(),
                    persistent: r.r#type() == Some(&SpotInstanceType::Persistent),
                })
            }))
    }

    /// The current spot price of an instance type in an availability zone (Linux).
    pub async fn spot_price(
        &self,
        instance_type: &str,
        zone: &str,
    ) -> Result<Option<f64>, CloudError> {
        let out = self
            .client()
            .await
            .describe_spot_price_history()
            .instance_types(aws_sdk_ec2::types::InstanceType::from(instance_type))
            .filters(
                Filter::builder()
                    .name("availability-zone")
                    .values(zone)
                    .build(),
            )
            .start_time(aws_sdk_ec2::primitives::DateTime::from_secs(
                crate::time::now() as i64,
            ))
            .send()
            .await
            .map_err(|e| classify("DescribeSpotPriceHistory", e))?;
        // "Linux/UNIX" and "Linux/UNIX (Amazon VPC)" are the same price for Linux instances.
        Ok(out
            .spot_price_history()
            .iter()
            .filter(|p| p.availability_zone().is_none_or(|z| z == zone))
            .filter(|p| {
                p.product_description()
                    .is_none_or(|d| d.as_str().starts_with("Linux/UNIX"))
            })
            .filter_map(|p| crate::cost::parse_hourly_usd(p.spot_price()?))
            .next())
    }

    /// Tags the instance with what gpuwatch is about to do, before it does it.
    pub async fn tag_action(&self, action: &str, rule: &str) -> Result<Option<String>, CloudError> {
        let out = self
            .client()
            .await
            .create_tags()
            .resources(&self.instance_id)
            .tags(Tag::builder().key("gpuwatch:action").value(action).build())
            .tags(Tag::builder().key("gpuwatch:rule").value(rule).build())
            .send()
            .await
            .map_err(|e| classify("CreateTags", e))?;
        Ok(out.request_id().map(str::to_string))
    }

    pub async fn stop(&self, hibernate: bool) -> Result<Option<String>, CloudError> {
        let out = self
            .client()
            .await
            .stop_instances()
            .instance_ids(&self.instance_id)
            .hibernate(hibernate)
            .send()
            .await
            .map_err(|e| classify("StopInstances", e))?;
        Ok(out.request_id().map(str::to_string))
    }

    pub async fn terminate(&self) -> Result<Option<String>, CloudError> {
        let out = self
            .client()
            .await
            .terminate_instances()
            .instance_ids(&self.instance_id)
            .send()
            .await
            .map_err(|e| classify("TerminateInstances", e))?;
        Ok(out.request_id().map(str::to_string))
    }

    pub async fn cancel_spot_request(&self, id: &str) -> Result<Option<String>, CloudError> {
        let out = self
            .client()
            .await
            .cancel_spot_instance_requests()
            .spot_instance_request_ids(id)
            .send()
            .await
            .map_err(|e| classify("CancelSpotInstanceRequests", e))?;
        Ok(out.request_id().map(str::to_string))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{Instance, Reservation};

    /// Only the instance the answer names is this one: another's, or none, says nothing of it.
    #[test]
    fn only_the_instance_named_is_this_one() {
        let of = |id: &str| Instance::builder().instance_id(id).build();
        let answer = [Reservation::builder()
            .instances(of("i-other"))
            .instances(of("i-mine"))
            .build()];
        assert_eq!(
            named(&answer, "i-mine").and_then(|i| i.instance_id()),
            Some("i-mine")
        );
        assert!(named(&answer[..0], "i-mine").is_none());
        let others = [Reservation::builder().instances(of("i-other")).build()];
        assert!(named(&others, "i-mine").is_none());
    }
}
