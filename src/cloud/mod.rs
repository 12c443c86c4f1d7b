//! The cloud boundary: instance metadata and the EC2 API.

pub mod ec2;
pub mod imds;
pub use gpuwatch_core::plan;
pub mod services;
