//! The driver's `gpu_metrics` table: a versioned binary struct (the kernel's
//! `kgd_pp_interface.h`), a header of its size and format and content revisions, then the
//! fields of that version at their natural C alignment, little-endian. A field the GPU does not
//! fill is all ones. gpuwatch reads the discrete GPUs' versions 1.1 to 1.9 (Instinct MI100 and
//! MI200 write 1.3; MI300 1.4 to 1.9; Radeon 1.1 to 1.3), and no other: a version it does not
//! know, or a table whose size is not its version's, gives nothing. Version 1.9 describes itself:
//! after the header, a count of attributes, each an encoding (unit, type, id, element count)
//! and then its values, packed.

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
    /// Shorter than its header, or than the size it says, or (1.9) attributes that do not fit
    /// in it.
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
    if (format, content) == (1, 9) {
        return attributes(bytes, size);
    }
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

/// Version 1.9's attribute ids (`enum amdgpu_metrics_attr_id`) that gpuwatch reads.
mod id {
    pub const TEMPERATURE_HOTSPOT: u64 = 0;
    pub const TEMPERATURE_MEM: u64 = 1;
    pub const CURR_SOCKET_POWER: u64 = 3;
    pub const AVERAGE_GFX_ACTIVITY: u64 = 4;
    pub const AVERAGE_UMC_ACTIVITY: u64 = 5;
    pub const ENERGY_ACCUMULATOR: u64 = 7;
    pub const CURRENT_GFXCLK: u64 = 33;
    pub const CURRENT_UCLK: u64 = 37;
}

/// The most attributes a 1.9 table is believed to hold (MI300 writes 47).
const MAX_ATTRIBUTES: usize = 1024;

/// A version 1.9 table: `attr_count` (s32) after the header, then each attribute's encoding
/// (u64: unit << 24, type << 20, id << 10, element count) and its elements, packed. An
/// attribute whose id gpuwatch does not read is passed over by its size; one of a type it
/// does not know cannot be, and makes the table bad.
fn attributes(bytes: &[u8], size: u16) -> Result<Metrics, Unread> {
    let end = usize::from(size);
    if bytes.len() < end || end < 8 {
        return Err(Unread::Truncated);
    }
    let bytes = &bytes[..end];
    let count = i32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let count = usize::try_from(count)
        .ok()
        .filter(|&n| n <= MAX_ATTRIBUTES)
        .ok_or(Unread::Truncated)?;
    let mut m = Metrics::default();
    let mut at = 8;
    for _ in 0..count {
        let enc = bytes
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .ok_or(Unread::Truncated)?;
        let width: usize = match (enc >> 20) & 0xf {
            0 | 1 => 1,
            2 | 3 => 2,
            4 | 5 => 4,
            6 | 7 => 8,
            _ => return Err(Unread::Truncated),
        };
        let elements = (enc & 0x3ff) as usize;
        let values = bytes
            .get(at + 8..at + 8 + width * elements)
            .ok_or(Unread::Truncated)?;
        at += 8 + width * elements;
        // The first element, unless the GPU left it unfilled (all ones).
        let Some(first) = values.get(..width) else {
            continue;
        };
        let mut raw = [0u8; 8];
        raw[..width].copy_from_slice(first);
        let v = u64::from_le_bytes(raw);
        if v == u64::MAX >> (64 - 8 * width) {
            continue;
        }
        let small = || u16::try_from(v).ok().map(f64::from);
        let celsius = || small().filter(|&t| t <= 200.0);
        let ratio = || small().filter(|&p| p <= 100.0).map(|p| p / 100.0);
        let mhz = || small().map(|f| f * 1e6);
        // Each reading in the unit it is known in (`enum amdgpu_metrics_attr_unit`: none 0,
        // MHz 1, °C 2, W 3, percent 10); another unit is a change gpuwatch does not know.
        match ((enc >> 10) & 0x3ff, enc >> 24) {
            (id::TEMPERATURE_HOTSPOT, 2) => m.temperature_hotspot = celsius(),
            (id::TEMPERATURE_MEM, 2) => m.temperature_mem = celsius(),
            (id::CURR_SOCKET_POWER, 3) => m.socket_power_watts = small(),
            (id::AVERAGE_GFX_ACTIVITY, 10) => m.gfx_activity = ratio(),
            (id::AVERAGE_UMC_ACTIVITY, 10) => m.umc_activity = ratio(),
            (id::ENERGY_ACCUMULATOR, 0) => m.energy_joules = Some(v as f64 / 65536.0),
            (id::CURRENT_GFXCLK, 1) => m.gfxclk_hz = mhz(),
            (id::CURRENT_UCLK, 1) => m.uclk_hz = mhz(),
            _ => {}
        }
    }
    Ok(m)
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

    /// One 1.9 attribute: its encoding (`unit`, `kind` as the driver's type enum, `id`) and
    /// its elements, each `width` bytes.
    fn attr(out: &mut Vec<u8>, unit: u64, kind: u64, id: u64, width: usize, values: &[u64]) {
        let enc = unit << 24 | kind << 20 | id << 10 | values.len() as u64;
        out.extend_from_slice(&enc.to_le_bytes());
        for v in values {
            out.extend_from_slice(&v.to_le_bytes()[..width]);
        }
    }

    /// A 1.9 table as SMU 13.0.6 writes it, in part: temperatures, power, activities, the
    /// memory bandwidth (an attribute gpuwatch passes over), the energy, the clocks.
    fn v1_9() -> Vec<u8> {
        let mut t = vec![0, 0, 1, 9];
        t.extend_from_slice(&9i32.to_le_bytes());
        attr(&mut t, 2, 2, 0, 2, &[71]); // hotspot, U16, °C
        attr(&mut t, 2, 2, 1, 2, &[63]); // memory
        attr(&mut t, 3, 2, 3, 2, &[612]); // socket power, W
        attr(&mut t, 10, 2, 4, 2, &[88]); // graphics activity, %
        attr(&mut t, 10, 2, 5, 2, &[0xffff]); // memory activity: unfilled
        attr(&mut t, 8, 6, 6, 8, &[5300]); // memory bandwidth, U64: passed over
        attr(&mut t, 0, 6, 7, 8, &[65536 * 4000]); // energy
        attr(
            &mut t,
            1,
            2,
            33,
            2,
            &[2100, 2095, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff],
        );
        attr(&mut t, 1, 2, 37, 2, &[1300]); // memory clock
        let size = t.len() as u16;
        t[..2].copy_from_slice(&size.to_le_bytes());
        t
    }

    #[test]
    fn version_1_9_describes_itself() {
        let m = parse(&v1_9()).unwrap();
        assert_eq!(m.temperature_hotspot, Some(71.0));
        assert_eq!(m.temperature_mem, Some(63.0));
        assert_eq!(m.socket_power_watts, Some(612.0));
        assert_eq!(m.gfx_activity, Some(0.88));
        assert_eq!(m.umc_activity, None);
        assert_eq!(m.energy_joules, Some(4000.0));
        assert_eq!(m.gfxclk_hz, Some(2.1e9));
        assert_eq!(m.uclk_hz, Some(1.3e9));
        assert_eq!(m.temperature_edge, None);
    }

    #[test]
    fn a_1_9_table_whose_attributes_do_not_fit_is_bad() {
        let t = v1_9();
        // Cut short: the size says more than was read.
        assert_eq!(parse(&t[..t.len() - 1]), Err(Unread::Truncated));
        // The size says less than the attributes need.
        let mut short = t.clone();
        short[..2].copy_from_slice(&((t.len() - 2) as u16).to_le_bytes());
        assert_eq!(parse(&short), Err(Unread::Truncated));
        // More attributes than any GPU writes, or fewer than none.
        for n in [100_000i32, -1] {
            let mut bad = t.clone();
            bad[4..8].copy_from_slice(&n.to_le_bytes());
            assert_eq!(parse(&bad), Err(Unread::Truncated));
        }
        // A type the driver has no number for.
        let mut bad = t.clone();
        bad[8 + 2] |= 0xf0;
        assert_eq!(parse(&bad), Err(Unread::Truncated));
        // A reading in a unit it is not known in is left out.
        let mut other = vec![0, 0, 1, 9];
        other.extend_from_slice(&1i32.to_le_bytes());
        attr(&mut other, 7, 2, 3, 2, &[612]); // socket power in 0.1 GT/s
        let size = other.len() as u16;
        other[..2].copy_from_slice(&size.to_le_bytes());
        assert_eq!(parse(&other), Ok(Metrics::default()));
        // No attributes at all: nothing, and no error.
        let empty = [8u8, 0, 1, 9, 0, 0, 0, 0];
        assert_eq!(parse(&empty), Ok(Metrics::default()));
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
        // APU tables (2.x, 3.0), 1.0 (not naturally aligned), a revision after 1.9, and a
        // known revision with the wrong size.
        assert_eq!(parse(&table(120, 0)[..]), Err(Unread::Version(1, 0, 120)));
        let mut apu = table(120, 1);
        apu[2] = 2;
        assert_eq!(parse(&apu), Err(Unread::Version(2, 1, 120)));
        assert_eq!(parse(&table(1150, 10)), Err(Unread::Version(1, 10, 1150)));
        assert_eq!(parse(&table(128, 3)), Err(Unread::Version(1, 3, 128)));
        // Garbage within a known layout: out-of-range values are left out.
        let mut t = table(120, 3);
        put16(&mut t, 4, 9000);
        put16(&mut t, 16, 250);
        let m = parse(&t).unwrap();
        assert_eq!((m.temperature_edge, m.gfx_activity), (None, None));
    }
}
