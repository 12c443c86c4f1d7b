//! The cloud boundary: instance metadata and the EC2 API.

pub mod ec2;
pub mod imds;
pub mod plan;
pub mod services;
