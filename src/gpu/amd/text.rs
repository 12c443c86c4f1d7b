//! The amdgpu driver's sysfs text files, parsed: each parser takes a file's whole text and
//! gives its value, or `None` where the text is not what the kernel prints (which the reader
//! counts as bad data, never as 0).

/// A decimal whole number, as `"%u\n"`, `"%llu\n"` or `"%d\n"` print a non-negative one.
pub fn whole(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// A busy percent (`gpu_busy_percent`, `mem_busy_percent`: `"%d\n"`), as a ratio from 0 to 1.
pub fn percent(text: &str) -> Option<f64> {
    whole(text).filter(|&p| p <= 100).map(|p| p as f64 / 100.0)
}

/// The clock of the level marked active (`*`) in `pp_dpm_sclk` or `pp_dpm_mclk`
/// (`"%d: %uMhz %s\n"`; a deep-sleep level is `S:`), in Hz.
pub fn active_clock_hz(text: &str) -> Option<f64> {
    let mut active = None;
    for line in text.lines() {
        let line = line.trim_end();
        let Some(rest) = line.strip_suffix('*') else {
            continue;
        };
        let (_, value) = rest.split_once(':')?;
        let v = value.trim();
        let unit = v.len().checked_sub(3)?;
        if !v.get(unit..)?.eq_ignore_ascii_case("mhz") {
            return None;
        }
        let mhz = whole(&v[..unit])?;
        // Two levels marked active is not what the driver prints.
        if active.replace(mhz).is_some() {
            return None;
        }
    }
    active.filter(|&m| m <= 100_000).map(|m| m as f64 * 1e6)
}

/// A PCIe link speed (`current_link_speed`, `max_link_speed`: `"16.0 GT/s PCIe\n"`, or
/// `"8 GT/s\n"` from older kernels) as its generation, 1 to 7. `Some(None)` for the kernel's
/// "Unknown" (the link is down or reports nothing), `None` for text that is neither.
pub fn link_generation(text: &str) -> Option<Option<u32>> {
    let t = text.trim();
    if t == "Unknown" || t == "Unknown speed" {
        return Some(None);
    }
    let rate = t.strip_suffix(" PCIe").unwrap_or(t).strip_suffix(" GT/s")?;
    let generation = match rate {
        "2.5" => 1,
        "5" | "5.0" => 2,
        "8" | "8.0" => 3,
        "16" | "16.0" => 4,
        "32" | "32.0" => 5,
        "64" | "64.0" => 6,
        "128" | "128.0" => 7,
        _ => return None,
    };
    Some(Some(generation))
}

/// A PCIe link width in lanes (`"%u\n"`), 1 to 32; 0 is a link that reports none.
pub fn link_width(text: &str) -> Option<Option<u32>> {
    match whole(text)? {
        0 => Some(None),
        w @ 1..=32 => Some(Some(w as u32)),
        _ => None,
    }
}

/// A RAS block's error counts (`ras/<block>_err_count`: `"ue: %lu\nce: %lu\n"`, and a `de:`
/// line on newer kernels): uncorrectable, then correctable. `Some(None)` while the driver says
/// the counts cannot be read now (`Query currently inaccessible`, during a reset).
pub fn ras_counts(text: &str) -> Option<Option<(u64, u64)>> {
    if text.trim() == "Query currently inaccessible" {
        return Some(None);
    }
    let (mut ue, mut ce) = (None, None);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (key, value) = line.split_once(':')?;
        let value = whole(value)?;
        match key.trim() {
            "ue" => ue = Some(value),
            "ce" => ce = Some(value),
            "de" => {}
            _ => return None,
        }
    }
    Some(Some((ue?, ce?)))
}

/// The GPU's unique id (`unique_id`: `"%016llx\n"`; empty where the driver has none).
pub fn unique_id(text: &str) -> Option<Option<String>> {
    let t = text.trim();
    if t.is_empty() {
        return Some(None);
    }
    (t.len() <= 16 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| Some(t.to_ascii_lowercase()))
}

/// A name the driver prints (`product_name`: `"%s\n"` of the board's FRU bytes; empty on cards
/// without one): trimmed, at most 96 characters, control characters refused.
pub fn name(text: &str) -> Option<Option<String>> {
    let t = text.trim();
    if t.is_empty() {
        return Some(None);
    }
    (t.chars().count() <= 96 && !t.chars().any(char::is_control)).then(|| Some(t.to_string()))
}

/// A vendor id (`vendor`: `"0x%04x\n"`).
pub fn vendor(text: &str) -> Option<u16> {
    let t = text.trim();
    let hex = t.strip_prefix("0x").unwrap_or(t);
    (hex.len() == 4)
        .then(|| u16::from_str_radix(hex, 16).ok())
        .flatten()
}

/// A PCI address as the kernel names a device (`0000:03:00.0`: domain, bus, device, function
/// 0 to 7), lowercase.
pub fn pci_address(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    let ok = b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11]);
    ok.then(|| name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_percents_as_the_kernel_prints_them() {
        assert_eq!(whole("17163091968\n"), Some(17_163_091_968));
        assert_eq!(whole("0\n"), Some(0));
        for bad in [
            "",
            "\n",
            "-1\n",
            "12 34",
            "1e3",
            "0x10",
            "99999999999999999999999",
        ] {
            assert_eq!(whole(bad), None, "{bad:?}");
        }
        assert_eq!(percent("37\n"), Some(0.37));
        assert_eq!(percent("100\n"), Some(1.0));
        assert_eq!(percent("101\n"), None);
        assert_eq!(percent("-5\n"), None);
    }

    #[test]
    fn the_active_dpm_level() {
        assert_eq!(
            active_clock_hz("0: 500Mhz \n1: 1800Mhz *\n2: 2615Mhz \n"),
            Some(1.8e9)
        );
        assert_eq!(
            active_clock_hz("S: 19Mhz *\n1: 500Mhz \n2: 2615Mhz \n"),
            Some(19e6)
        );
        assert_eq!(
            active_clock_hz("0: 96Mhz \n1: 456Mhz \n2: 772Mhz \n3: 1249Mhz *\n"),
            Some(1.249e9)
        );
        assert_eq!(
            active_clock_hz("S: 45Mhz *\n0: 500Mhz\n1: 2100Mhz\n"),
            Some(45e6)
        );
        // None marked, two marked, garbage, and the file's "unavailable".
        for bad in [
            "0: 500Mhz \n1: 1800Mhz \n",
            "0: 500Mhz *\n1: 1800Mhz *\n",
            "0: lotsMhz *\n",
            "unavailable\n",
            "",
        ] {
            assert_eq!(active_clock_hz(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn link_speeds_of_new_and_old_kernels() {
        assert_eq!(link_generation("16.0 GT/s PCIe\n"), Some(Some(4)));
        assert_eq!(link_generation("2.5 GT/s PCIe\n"), Some(Some(1)));
        assert_eq!(link_generation("32.0 GT/s PCIe\n"), Some(Some(5)));
        assert_eq!(link_generation("8 GT/s\n"), Some(Some(3)));
        assert_eq!(link_generation("Unknown\n"), Some(None));
        assert_eq!(link_generation("Unknown speed\n"), Some(None));
        assert_eq!(link_generation("33 MHz PCI\n"), None);
        assert_eq!(link_generation("9.9 GT/s PCIe\n"), None);
        assert_eq!(link_width("16\n"), Some(Some(16)));
        assert_eq!(link_width("0\n"), Some(None));
        assert_eq!(link_width("255\n"), None);
    }

    #[test]
    fn ras_counts_with_and_without_deferred_errors() {
        // The driver's documented example.
        assert_eq!(ras_counts("ue: 0\nce: 1\n"), Some(Some((0, 1))));
        assert_eq!(ras_counts("ue: 2\nce: 3\nde: 7\n"), Some(Some((2, 3))));
        assert_eq!(ras_counts("Query currently inaccessible\n"), Some(None));
        for bad in ["", "ue: 1\n", "ue: x\nce: 1\n", "oops: 1\nue: 0\nce: 0\n"] {
            assert_eq!(ras_counts(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn identity_files() {
        assert_eq!(
            unique_id("0123456789abcdef\n"),
            Some(Some("0123456789abcdef".to_string()))
        );
        assert_eq!(unique_id("\n"), Some(None));
        assert_eq!(unique_id(""), Some(None));
        assert_eq!(unique_id("GPU-123\n"), None);
        assert_eq!(
            name("AMD Instinct MI300X  \n"),
            Some(Some("AMD Instinct MI300X".to_string()))
        );
        assert_eq!(name("\n"), Some(None));
        assert_eq!(name("bad\u{7}bell\n"), None);
        assert_eq!(vendor("0x1002\n"), Some(0x1002));
        assert_eq!(vendor("0x10de\n"), Some(0x10de));
        assert_eq!(vendor("amd\n"), None);
        assert_eq!(
            pci_address("0000:03:00.0"),
            Some("0000:03:00.0".to_string())
        );
        assert_eq!(
            pci_address("0000:C1:00.0"),
            Some("0000:c1:00.0".to_string())
        );
        assert_eq!(pci_address("device"), None);
    }
}
