//! One test per XID code: what the catalog says of it (its recommended action), and whether
//! gpuwatch holds it against the GPU (`unhealthy`) or only counts it (`counted`). A change to
//! `xids.csv` changes one of these on purpose.

use super::*;

macro_rules! xids {
    ($($name:ident: $code:literal => $action:ident, $verdict:ident;)*) => {
        $(
            #[test]
            fn $name() {
                let x = xid($code).expect("in the catalog");
                assert_eq!(x.action.as_str(), stringify!($action), "XID {}", $code);
                assert_eq!(
                    x.makes_unhealthy(),
                    stringify!($verdict) == "unhealthy",
                    "XID {}: {}", $code, x.meaning
                );
            }
        )*
    };
}

xids! {
    xid_1: 1 => report_hardware, unhealthy;
    xid_2: 2 => report_hardware, unhealthy;
    xid_3: 3 => report_hardware, unhealthy;
    xid_4: 4 => report_hardware, unhealthy;
    xid_5: 5 => report_hardware, unhealthy;
    xid_6: 6 => report_hardware, unhealthy;
    xid_7: 7 => report_hardware, unhealthy;
    xid_8: 8 => restart_app, counted;
    xid_9: 9 => report_hardware, unhealthy;
    xid_10: 10 => report_hardware, unhealthy;
    xid_11: 11 => restart_app, counted;
    xid_12: 12 => report_hardware, unhealthy;
    xid_13: 13 => restart_app, counted;
    xid_14: 14 => none, counted;
    xid_15: 15 => report_hardware, unhealthy;
    xid_16: 16 => report_hardware, unhealthy;
    xid_17: 17 => report_hardware, unhealthy;
    xid_18: 18 => report_hardware, unhealthy;
    xid_19: 19 => report_hardware, unhealthy;
    xid_20: 20 => report_hardware, unhealthy;
    xid_21: 21 => report_hardware, unhealthy;
    xid_22: 22 => report_hardware, unhealthy;
    xid_23: 23 => report_hardware, unhealthy;
    xid_24: 24 => report_hardware, unhealthy;
    xid_25: 25 => restart_app, counted;
    xid_26: 26 => report_hardware, unhealthy;
    xid_27: 27 => report_hardware, unhealthy;
    xid_28: 28 => report_hardware, unhealthy;
    xid_29: 29 => report_hardware, unhealthy;
    xid_30: 30 => report_hardware, unhealthy;
    xid_31: 31 => restart_app, counted;
    xid_32: 32 => restart_app, counted;
    xid_33: 33 => report_hardware, unhealthy;
    xid_34: 34 => report_hardware, unhealthy;
    xid_35: 35 => report_hardware, unhealthy;
    xid_36: 36 => report_hardware, unhealthy;
    xid_37: 37 => none, counted;
    xid_38: 38 => none, counted;
    xid_39: 39 => restart_app, counted;
    xid_40: 40 => restart_app, counted;
    xid_41: 41 => restart_app, counted;
    xid_42: 42 => report_hardware, unhealthy;
    xid_43: 43 => none, counted;
    xid_44: 44 => none, counted;
    xid_45: 45 => none, counted;
    xid_46: 46 => reset_gpu, unhealthy;
    xid_47: 47 => report_hardware, unhealthy;
    xid_48: 48 => reset_gpu, unhealthy;
    xid_49: 49 => report_hardware, unhealthy;
    xid_50: 50 => report_hardware, unhealthy;
    xid_51: 51 => report_hardware, unhealthy;
    xid_52: 52 => report_hardware, unhealthy;
    xid_53: 53 => report_hardware, unhealthy;
    xid_54: 54 => report_hardware, unhealthy;
    xid_55: 55 => report_hardware, unhealthy;
    xid_56: 56 => report_hardware, unhealthy;
    xid_57: 57 => report_hardware, unhealthy;
    xid_58: 58 => report_hardware, unhealthy;
    xid_59: 59 => report_hardware, unhealthy;
    xid_60: 60 => restart_app, counted;
    xid_61: 61 => report_hardware, unhealthy;
    xid_62: 62 => reset_gpu, unhealthy;
    xid_63: 63 => none, counted;
    xid_64: 64 => reset_gpu, unhealthy;
    xid_65: 65 => report_hardware, unhealthy;
    xid_66: 66 => none, counted;
    xid_67: 67 => none, counted;
    xid_68: 68 => restart_app, counted;
    xid_69: 69 => restart_app, counted;
    xid_70: 70 => restart_app, counted;
    xid_71: 71 => restart_app, counted;
    xid_72: 72 => restart_app, counted;
    xid_73: 73 => report_hardware, unhealthy;
    xid_74: 74 => reset_gpu, unhealthy;
    xid_75: 75 => restart_app, counted;
    xid_76: 76 => restart_app, counted;
    xid_77: 77 => restart_app, counted;
    xid_78: 78 => report_hardware, unhealthy;
    xid_79: 79 => reboot_node, unhealthy;
    xid_80: 80 => restart_app, counted;
    xid_81: 81 => report_hardware, unhealthy;
    xid_82: 82 => restart_app, counted;
    xid_83: 83 => restart_app, counted;
    xid_84: 84 => restart_app, counted;
    xid_85: 85 => restart_app, counted;
    xid_86: 86 => restart_app, counted;
    xid_87: 87 => report_hardware, unhealthy;
    xid_88: 88 => restart_app, counted;
    xid_89: 89 => restart_app, counted;
    xid_90: 90 => report_hardware, unhealthy;
    xid_91: 91 => report_hardware, unhealthy;
    xid_92: 92 => none, counted;
    xid_93: 93 => none, counted;
    xid_94: 94 => restart_app, counted;
    xid_95: 95 => reset_gpu, unhealthy;
    xid_96: 96 => restart_app, counted;
    xid_97: 97 => restart_app, counted;
    xid_98: 98 => restart_app, counted;
    xid_99: 99 => restart_app, counted;
    xid_100: 100 => restart_app, counted;
    xid_101: 101 => restart_app, counted;
    xid_102: 102 => restart_app, counted;
    xid_103: 103 => restart_app, counted;
    xid_104: 104 => restart_app, counted;
    xid_105: 105 => restart_app, counted;
    xid_106: 106 => none, counted;
    xid_107: 107 => none, counted;
    xid_108: 108 => none, counted;
    xid_109: 109 => reset_gpu, unhealthy;
    xid_110: 110 => reset_gpu, unhealthy;
    xid_111: 111 => report_hardware, unhealthy;
    xid_112: 112 => report_hardware, unhealthy;
    xid_113: 113 => report_hardware, unhealthy;
    xid_114: 114 => report_hardware, unhealthy;
    xid_115: 115 => report_hardware, unhealthy;
    xid_116: 116 => report_hardware, unhealthy;
    xid_117: 117 => report_hardware, unhealthy;
    xid_118: 118 => report_hardware, unhealthy;
    xid_119: 119 => reset_gpu, unhealthy;
    xid_120: 120 => reset_gpu, unhealthy;
    xid_121: 121 => none, counted;
    xid_122: 122 => report_hardware, unhealthy;
    xid_123: 123 => report_hardware, unhealthy;
    xid_124: 124 => report_hardware, unhealthy;
    xid_125: 125 => report_hardware, unhealthy;
    xid_126: 126 => restart_app, counted;
    xid_127: 127 => restart_app, counted;
    xid_128: 128 => restart_app, counted;
    xid_129: 129 => restart_app, counted;
    xid_130: 130 => restart_app, counted;
    xid_131: 131 => restart_app, counted;
    xid_132: 132 => restart_app, counted;
    xid_133: 133 => restart_app, counted;
    xid_134: 134 => restart_app, counted;
    xid_135: 135 => restart_app, counted;
    xid_136: 136 => reset_gpu, unhealthy;
    xid_137: 137 => none, counted;
    xid_138: 138 => report_hardware, unhealthy;
    xid_139: 139 => restart_app, counted;
    xid_140: 140 => reset_gpu, unhealthy;
    xid_141: 141 => none, counted;
    xid_142: 142 => report_hardware, unhealthy;
    xid_143: 143 => reset_gpu, unhealthy;
    xid_144: 144 => reset_gpu, unhealthy;
    xid_145: 145 => reset_gpu, unhealthy;
    xid_146: 146 => reset_gpu, unhealthy;
    xid_147: 147 => none, counted;
    xid_148: 148 => none, counted;
    xid_149: 149 => reset_gpu, unhealthy;
    xid_150: 150 => reset_gpu, unhealthy;
    xid_151: 151 => reboot_node, unhealthy;
    xid_152: 152 => none, counted;
    xid_153: 153 => none, counted;
    xid_154: 154 => none, counted;
    xid_155: 155 => reset_gpu, unhealthy;
    xid_156: 156 => reset_gpu, unhealthy;
    xid_157: 157 => none, counted;
    xid_158: 158 => reset_gpu, unhealthy;
    xid_159: 159 => reset_gpu, unhealthy;
    xid_160: 160 => none, counted;
    xid_161: 161 => none, counted;
    xid_162: 162 => none, counted;
    xid_163: 163 => none, counted;
    xid_164: 164 => none, counted;
    xid_165: 165 => report_hardware, unhealthy;
    xid_166: 166 => report_hardware, unhealthy;
    xid_167: 167 => report_hardware, unhealthy;
    xid_168: 168 => reboot_node, unhealthy;
    xid_169: 169 => reset_gpu, unhealthy;
    xid_170: 170 => report_hardware, unhealthy;
    xid_171: 171 => reset_gpu, unhealthy;
    xid_172: 172 => reset_gpu, unhealthy;
}

#[test]
fn the_catalog_is_every_code_from_1_once_in_order() {
    let codes: Vec<u64> = catalog().iter().map(|x| x.code).collect();
    let want: Vec<u64> = (1..=codes.len() as u64).collect();
    assert_eq!(codes, want);
    assert!(catalog()
        .iter()
        .all(|x| !x.meaning.is_empty() && x.meaning.len() <= 80));
}

/// The application's own errors are counted, never held against the GPU, whatever the action.
#[test]
fn what_the_catalog_blames_on_the_application_never_makes_a_gpu_unhealthy() {
    for code in [13, 31, 43, 45] {
        assert_eq!(xid(code).unwrap().blame, Blame::Application, "XID {code}");
    }
    assert!(catalog()
        .iter()
        .filter(|x| x.blame == Blame::Application)
        .all(|x| !x.makes_unhealthy()));
}

#[test]
fn a_code_the_catalog_does_not_list_is_unknown() {
    assert!(xid(0).is_none());
    assert!(xid(100_000).is_none());
}

#[test]
fn a_malformed_catalog_is_refused_naming_the_line() {
    for (text, want) in [
        ("1,none,driver,x\n", "line 1: expected the header"),
        (
            "code,action,blame,meaning\n2,none,driver,a\n1,none,driver,b\n",
            "line 3: XID 1 is out of order",
        ),
        (
            "code,action,blame,meaning\n1,sometimes,driver,a\n",
            "line 2: \"sometimes\" is not an action",
        ),
        (
            "code,action,blame,meaning\n1,none,nobody,a\n",
            "line 2: \"nobody\" is not a blame",
        ),
        (
            "code,action,blame,meaning\nx,none,driver,a\n",
            "line 2: \"x\" is not an XID",
        ),
        (
            "code,action,blame,meaning\n1,none,driver\n",
            "line 2: expected 4 columns",
        ),
        ("# nothing\n", "no header"),
    ] {
        let err = parse(text).unwrap_err();
        assert!(err.starts_with(want), "{err}");
    }
}
