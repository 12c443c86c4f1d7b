//! The messages of the kubelet's PodResources API v1 (`proto/podresources.proto`), written out
//! with prost's derive: gpuwatch needs no protoc at build time. Fields gpuwatch does not read
//! are declared all the same, so that a message decodes whole.

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
    #[prost(int64, repeated, tag = "3")]
    pub cpu_ids: Vec<i64>,
    #[prost(message, repeated, tag = "4")]
    pub memory: Vec<ContainerMemory>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMemory {
    #[prost(string, tag = "1")]
    pub memory_type: String,
    #[prost(uint64, tag = "2")]
    pub size: u64,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}
