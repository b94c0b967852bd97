//! What the CPU decides about how a model runs.

/// True on x86-64 CPUs without VNNI (AVX2, AVX-512 without VNNI), where ONNX
/// Runtime's U8S8 int8 MatMul (`vpmaddubsw`) saturates its 16-bit pair sums,
/// so an int8 model's output depends on the CPU. A CI run measured
/// e5-small-int8 at cosine 0.98683 to fp32 (mean 0.99585) where a VNNI Xeon
/// gives 0.99494 (0.99814), consistent with it (its log names no CPU). There
/// `session_builder` asks for the exact U8U8 kernel
/// (`session.x64quantprecision`); it touches only quantized MatMuls. That it
/// restores the VNNI figures on such a CPU is not measured yet. With VNNI
/// the default kernel is exact already, and the option would only slow it:
/// 0.63x e5-small-int8's tokens/s for the same output on a VNNI Xeon
/// (`benches/scripts/int8_exact_kernel.py`).
pub(crate) fn int8_saturates() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !(std::arch::is_x86_feature_detected!("avx512vnni") || std::arch::is_x86_feature_detected!("avxvnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    /// The CPUID answer agrees with the kernel's flags, an independent
    /// reading of the same CPU.
    #[test]
    fn the_vnni_check_agrees_with_proc_cpuinfo() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo on Linux");
        let flags: Vec<&str> = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .expect("a flags line in /proc/cpuinfo")
            .split_whitespace()
            .collect();
        let vnni = flags.contains(&"avx512_vnni") || flags.contains(&"avx_vnni");
        assert_eq!(super::int8_saturates(), !vnni, "CPUID and /proc/cpuinfo disagree on VNNI");
    }
}
