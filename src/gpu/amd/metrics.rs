//! The driver's `gpu_metrics` table: a versioned binary struct (the kernel's
//! `kgd_pp_interface.h`), a header of its size and format and content revisions, then the
//! fields of that version at their natural C alignment, little-endian. A field the GPU does not
//! fill is all ones. gpuwatch reads the discrete GPUs' versions 1.1 to 1.8 (Instinct MI100 and
//! MI200 write 1.3; MI300 1.4 to 1.8; Radeon 1.1 to 1.3), and no other: a version it does not
//! know, or a table whose size is not its version's, gives nothing.

/// What one table gave; each `None` where the version has no such field or the GPU left it
/// unfilled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    pub temperature_edge: Option<f64>,
    pub temperature_hotspot: Option<f64>,
    pub temperature_mem: Option<f64>,
    /// Graphics and memory-controller activity, 0 to 1.
    pub gfx_activity: Option<f64>,
    pub umc_activity: Option<f64>,
    /// The socket's power: averaged (1.1 to 1.3) or now (1.4 and later), in watts.
    pub socket_power_watts: Option<f64>,
    /// The energy accumulator, in joules (a count of 2⁻¹⁶ J, 15.259 µJ).
    pub energy_joules: Option<f64>,
    /// The graphics clock now (of the first XCC on MI300), and the memory clock, in Hz.
    pub gfxclk_hz: Option<f64>,
    pub uclk_hz: Option<f64>,
    pub throttle_status: Option<u32>,
}

/// Why a table gave nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Unread {
    /// Shorter than its header, or than the size it says.
    Truncated,
    /// A version gpuwatch does not read (format, content, size as the header says).
    Version(u8, u8, u16),
}

/// Where one version keeps the fields read: byte offsets, `None` where it has no such field.
struct Layout {
    size: u16,
    edge: Option<usize>,
    hotspot: usize,
    mem: usize,
    gfx_activity: usize,
    umc_activity: usize,
    power: usize,
    energy: usize,
    gfxclk: usize,
    uclk: usize,
    throttle: Option<usize>,
}

/// The discrete GPUs' layouts 1.1 to 1.3 share these offsets.
const fn v1_early(size: u16) -> Layout {
    Layout {
        size,
        edge: Some(4),
        hotspot: 6,
        mem: 8,
        gfx_activity: 16,
        umc_activity: 18,
        power: 22,
        energy: 24,
        gfxclk: 54,
        uclk: 58,
        throttle: Some(68),
    }
}

/// MI300's layouts (1.4 and later): no edge sensor, the power now at 10.
const fn v1_mi300(size: u16, energy: usize, gfxclk: usize, uclk: usize) -> Layout {
    Layout {
        size,
        edge: None,
        hotspot: 4,
        mem: 6,
        gfx_activity: 12,
        umc_activity: 14,
        power: 10,
        energy,
        gfxclk,
        uclk,
        throttle: None,
    }
}

/// The layout of a version, by its content revision and size (1.6 was released twice, with
/// two layouts of different sizes).
fn layout(content: u8, size: u16) -> Option<Layout> {
    let l = match (content, size) {
        (1, 96) | (2, 104) | (3, 120) => v1_early(size),
        (4, 288) => Layout {
            throttle: Some(40),
            ..v1_mi300(size, 24, 240, 280)
        },
        (5, 360) => Layout {
            throttle: Some(104),
            ..v1_mi300(size, 88, 312, 352)
        },
        (6, 384) => Layout {
            throttle: Some(128),
            ..v1_mi300(size, 88, 336, 376)
        },
        (6, 1664) => v1_mi300(size, 16, 264, 304),
        (7, 2208) | (8, 3872) => v1_mi300(size, 24, 296, 336),
        _ => return None,
    };
    Some(l)
}

/// The most a table is read: larger than any version known.
pub const MAX_BYTES: usize = 8192;

/// Reads a table.
pub fn parse(bytes: &[u8]) -> Result<Metrics, Unread> {
    if bytes.len() < 4 {
        return Err(Unread::Truncated);
    }
    let size = u16::from_le_bytes([bytes[0], bytes[1]]);
    let (format, content) = (bytes[2], bytes[3]);
    let layout = match format {
        1 => layout(content, size),
        _ => None,
    }
    .ok_or(Unread::Version(format, content, size))?;
    if bytes.len() < usize::from(layout.size) {
        return Err(Unread::Truncated);
    }
    let u16_at = |at: usize| {
        let v = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        (v != u16::MAX).then_some(v)
    };
    let u32_at = |at: usize| {
        let v = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0xff; 4]));
        (v != u32::MAX).then_some(v)
    };
    let u64_at = |at: usize| {
        let v = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0xff; 8]));
        (v != u64::MAX).then_some(v)
    };
    // Degrees Celsius; beyond 200 is bad data.
    let celsius = |at: usize| u16_at(at).filter(|&t| t <= 200).map(f64::from);
    let ratio = |at: usize| {
        u16_at(at)
            .filter(|&p| p <= 100)
            .map(|p| f64::from(p) / 100.0)
    };
    let mhz = |at: usize| u16_at(at).map(|m| f64::from(m) * 1e6);
    Ok(Metrics {
        temperature_edge: layout.edge.and_then(celsius),
        temperature_hotspot: celsius(layout.hotspot),
        temperature_mem: celsius(layout.mem),
        gfx_activity: ratio(layout.gfx_activity),
        umc_activity: ratio(layout.umc_activity),
        socket_power_watts: u16_at(layout.power).map(f64::from),
        energy_joules: u64_at(layout.energy).map(|n| n as f64 / 65536.0),
        gfxclk_hz: mhz(layout.gfxclk),
        uclk_hz: mhz(layout.uclk),
        throttle_status: layout.throttle.and_then(u32_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of `size` bytes, revision 1.`content`, every field unfilled.
    fn table(size: u16, content: u8) -> Vec<u8> {
        let mut t = vec![0xff; usize::from(size)];
        t[..2].copy_from_slice(&size.to_le_bytes());
        t[2] = 1;
        t[3] = content;
        t
    }

    fn put16(t: &mut [u8], at: usize, v: u16) {
        t[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn version_1_3_as_mi200_writes_it() {
        let mut t = table(120, 3);
        put16(&mut t, 4, 45);
        put16(&mut t, 6, 65);
        put16(&mut t, 8, 70);
        put16(&mut t, 16, 42);
        put16(&mut t, 18, 7);
        put16(&mut t, 22, 250);
        t[24..32].copy_from_slice(&(65536u64 * 1000).to_le_bytes());
        put16(&mut t, 54, 1700);
        put16(&mut t, 58, 1600);
        t[68..72].copy_from_slice(&4u32.to_le_bytes());
        let m = parse(&t).unwrap();
        assert_eq!(
            m,
            Metrics {
                temperature_edge: Some(45.0),
                temperature_hotspot: Some(65.0),
                temperature_mem: Some(70.0),
                gfx_activity: Some(0.42),
                umc_activity: Some(0.07),
                socket_power_watts: Some(250.0),
                energy_joules: Some(1000.0),
                gfxclk_hz: Some(1.7e9),
                uclk_hz: Some(1.6e9),
                throttle_status: Some(4),
            }
        );
    }

    #[test]
    fn mi300_versions_have_no_edge_sensor_and_their_own_offsets() {
        for (content, size, energy, gfxclk) in [
            (4u8, 288u16, 24, 240),
            (5, 360, 88, 312),
            (6, 384, 88, 336),
            (6, 1664, 16, 264),
            (7, 2208, 24, 296),
            (8, 3872, 24, 296),
        ] {
            let mut t = table(size, content);
            put16(&mut t, 10, 550);
            put16(&mut t, 12, 99);
            t[energy..energy + 8].copy_from_slice(&(3u64 << 16).to_le_bytes());
            put16(&mut t, gfxclk, 2100);
            let m = parse(&t).unwrap();
            assert_eq!(m.temperature_edge, None, "1.{content}");
            assert_eq!(m.socket_power_watts, Some(550.0), "1.{content}");
            assert_eq!(m.gfx_activity, Some(0.99), "1.{content}");
            assert_eq!(m.energy_joules, Some(3.0), "1.{content}");
            assert_eq!(m.gfxclk_hz, Some(2.1e9), "1.{content}");
            // Unfilled: all ones.
            assert_eq!(m.temperature_hotspot, None, "1.{content}");
        }
    }

    #[test]
    fn unknown_truncated_and_garbage_tables_give_nothing() {
        assert_eq!(parse(&[]), Err(Unread::Truncated));
        assert_eq!(parse(&[120, 0, 1]), Err(Unread::Truncated));
        // The header says 120 bytes of 1.3; 60 arrived.
        assert_eq!(parse(&table(120, 3)[..60]), Err(Unread::Truncated));
        // APU tables (2.x, 3.0), 1.0 (not naturally aligned), 1.9 (self-describing), and a
        // known revision with the wrong size.
        assert_eq!(parse(&table(120, 0)[..]), Err(Unread::Version(1, 0, 120)));
        let mut apu = table(120, 1);
        apu[2] = 2;
        assert_eq!(parse(&apu), Err(Unread::Version(2, 1, 120)));
        assert_eq!(parse(&table(1150, 9)), Err(Unread::Version(1, 9, 1150)));
        assert_eq!(parse(&table(128, 3)), Err(Unread::Version(1, 3, 128)));
        // Garbage within a known layout: out-of-range values are left out.
        let mut t = table(120, 3);
        put16(&mut t, 4, 9000);
        put16(&mut t, 16, 250);
        let m = parse(&t).unwrap();
        assert_eq!((m.temperature_edge, m.gfx_activity), (None, None));
    }
}
