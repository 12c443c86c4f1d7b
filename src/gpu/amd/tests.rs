//! The reader over trees on disk: what a file that vanishes between the list and the read, or
//! that holds garbage, leaves of a GPU's readings.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;

use super::AmdSource;
use crate::gpu::counters::SamplerCounters;

/// One AMD GPU at 0000:03:00.0 whose RAS directory holds `blocks`, and a process list with
/// one process holding nothing.
fn tree(root: &Path, blocks: &[(&str, &str)]) {
    let dev = root.join("sys/devices/pci0000:00/0000:03:00.0");
    std::fs::create_dir_all(dev.join("ras")).unwrap();
    std::fs::create_dir_all(root.join("sys/bus/pci/drivers/amdgpu")).unwrap();
    std::fs::create_dir_all(root.join("sys/class/drm/card0")).unwrap();
    std::fs::create_dir_all(root.join("proc/1/fdinfo")).unwrap();
    std::fs::write(dev.join("vendor"), "0x1002\n").unwrap();
    std::fs::write(dev.join("gpu_busy_percent"), "17\n").unwrap();
    symlink("../../../bus/pci/drivers/amdgpu", dev.join("driver")).unwrap();
    symlink(
        "../../../devices/pci0000:00/0000:03:00.0",
        root.join("sys/class/drm/card0/device"),
    )
    .unwrap();
    for (name, text) in blocks {
        std::fs::write(dev.join("ras").join(name), text).unwrap();
    }
}

fn source(root: &Path) -> AmdSource {
    AmdSource::new(root.join("sys"), Arc::new(SamplerCounters::default())).with_processes(
        root.join("proc"),
        false,
        false,
    )
}

#[test]
fn a_ras_block_that_vanishes_between_list_and_read_leaves_the_errors_unknown() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path(), &[("umc_err_count", "ue: 0\nce: 3\n")]);
    let mut src = source(tmp.path());
    let g = &src.sample(0)[0];
    assert_eq!((g.ecc_uncorrected, g.ecc_corrected), (Some(0), Some(3)));
    assert_eq!(g.utilization_ratio, Some(0.17));
    assert_eq!(g.processes, Some(0));
    // A block listed whose file is gone when read (a dangling entry): a partial sum would look
    // like a counter going back, so the cycle's errors are unknown, never the other blocks'.
    let ras = tmp.path().join("sys/devices/pci0000:00/0000:03:00.0/ras");
    symlink("gone", ras.join("gfx_err_count")).unwrap();
    let g = &src.sample(0)[0];
    assert_eq!((g.ecc_uncorrected, g.ecc_corrected), (None, None));
    assert_eq!(g.utilization_ratio, Some(0.17), "the other readings stay");
    // Garbage in a block, and the reset notice: unknown too.
    std::fs::remove_file(ras.join("gfx_err_count")).unwrap();
    for text in ["ue: lots\n", "Query currently inaccessible\n", ""] {
        std::fs::write(ras.join("gfx_err_count"), text).unwrap();
        let g = &src.sample(0)[0];
        assert_eq!(g.ecc_corrected, None, "{text:?}");
    }
    std::fs::write(ras.join("gfx_err_count"), "ue: 1\nce: 0\nde: 0\n").unwrap();
    let g = &src.sample(0)[0];
    assert_eq!((g.ecc_uncorrected, g.ecc_corrected), (Some(1), Some(3)));
}

#[test]
fn a_busy_percent_that_is_garbage_is_left_out_never_zero() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path(), &[]);
    let dev = tmp.path().join("sys/devices/pci0000:00/0000:03:00.0");
    let mut src = source(tmp.path());
    for text in ["", "-1\n", "101\n", "4x\n", "99999999999999999999999\n"] {
        std::fs::write(dev.join("gpu_busy_percent"), text).unwrap();
        let g = &src.sample(0)[0];
        assert!(g.up);
        assert_eq!(g.utilization_ratio, None, "{text:?}");
    }
    // A file that is no longer there is a reading the GPU lacks from then on.
    std::fs::remove_file(dev.join("gpu_busy_percent")).unwrap();
    let g = &src.sample(0)[0];
    assert_eq!(g.utilization_ratio, None);
    assert!(
        g.unsupported.contains(&"utilization"),
        "{:?}",
        g.unsupported
    );
}
