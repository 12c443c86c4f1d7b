//! Alibaba Cloud ECS. What is here so far: the request signature V3 (`sign.rs`), table-tested
//! against Alibaba's own worked example. `provider = "alibaba"` is not offered yet.

pub mod sign;
