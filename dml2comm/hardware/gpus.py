"""GPU presets: peak FLOP/s per data type, memory, and link line rates, every number sourced.

A :class:`GPU` holds the datasheet numbers the cost models need.  Conventions:

- ``peak_flops_per_s``: dense (no 2:4 sparsity) peak in FLOP/s, a multiply-add counted as 2.
  Keys: ``"fp32"`` is the *non-tensor-core* FP32 (CUDA-core FMA) peak; ``"tf32"``, ``"bf16"``,
  ``"fp16"`` and ``"fp8"`` are tensor-core (matrix-core) peaks.  A key is present only where a
  source gives the number.  Where a datasheet prints only figures *with sparsity* (H100, L40S)
  we store half of them, as the datasheets themselves say ("specifications 1/2 lower without
  sparsity").
- ``hbm_bytes`` / ``hbm_bytes_per_s``: device-memory capacity and peak bandwidth, in decimal
  units as printed on the datasheet (80 GB = 80e9 bytes; the device itself reports 80 GiB,
  so this is conservative by about 7 %).  For GDDR6 parts (RTX A6000, L40S) the field holds the
  GDDR6 numbers.
- ``nvlink_bytes_per_s``: GPU-to-GPU line rate per direction, summed over all of the GPU's links
  (0 when the GPU has none).  Half of the "bidirectional" figure NVIDIA prints.
- ``pcie_bytes_per_s``: host-interface line rate per direction (half of the bidirectional figure).
- ``sources``: one entry per number, keyed by field name (``"peak_flops_per_s.bf16"`` for a
  peak), saying where the number comes from.  :meth:`GPU.unsourced_fields` lists numbers that
  lack one; every preset has none (tested).

Achieved-versus-line-rate efficiencies of links live on :class:`dml2comm.hardware.cluster.Link`,
not here: they depend on the system (NVSwitch, hybrid cube-mesh, NIC count), not the chip.

References
----------
NVIDIA A100 datasheet and Ampere whitepaper (as tabulated at glennklockwood.com/garden/processors/A100);
NVIDIA H100 whitepaper / datasheet (glennklockwood.com/garden/processors/h100; datasheet table as
reproduced by hpctech.co.jp); NVIDIA Tesla V100 datasheet and DGX-1 system-architecture whitepaper;
NVIDIA RTX A6000 datasheet (servethehome.com reproduction) and Microway's Ampere comparison;
NVIDIA L40S datasheet (reseller reproductions); AMD ROCm documentation, "AMD Instinct MI300 series
microarchitecture"; Narayanan et al., SC'21 (arXiv:2104.04473) Sec. 5; MLCommons inference v4.1
system description H200-SXM-141GBx8; sjeaugey in NVIDIA/nccl-tests#149 and #212.  See also
shared/data/hardware_presets_sources.json.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from dml2comm.errors import ConfigError

__all__ = [
    "CALIBRATED_CLASSES",
    "DTYPE_KEYS",
    "GPU",
    "GPUS",
    "GPU_ALIASES",
    "get_gpu",
    "gpu_names",
]

#: The peak-FLOP/s keys a GPU may carry, in display order.
DTYPE_KEYS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")

# Spellings accepted by GPU.peak_flops (ONNX/DType labels and common short names).
_DTYPE_SPELLINGS: Mapping[str, str] = MappingProxyType(
    {
        "fp32": "fp32",
        "float32": "fp32",
        "float": "fp32",
        "tf32": "tf32",
        "bf16": "bf16",
        "bfloat16": "bf16",
        "fp16": "fp16",
        "float16": "fp16",
        "half": "fp16",
        "fp8": "fp8",
        "float8": "fp8",
    }
)

_NUMERIC_FIELDS: tuple[str, ...] = ("hbm_bytes", "hbm_bytes_per_s", "nvlink_bytes_per_s", "pcie_bytes_per_s")


#: The kernel classes a calibrated GPU may carry a value for (:attr:`GPU.calibrated_classes`;
#: what each means and which cost term reads it: :mod:`dml2comm.cost.calibrated`).
CALIBRATED_CLASSES = ("gemm_large", "gemm_small", "gemm_unaligned", "conv", "attention_fwd", "attention_bwd", "pointwise", "norm",
                      "layer_norm", "optimizer")
#: Classes whose value may be limited to a shape regime: the GEMM classes, by the GEMM's smallest
#: dimension ``min(M, N, K)`` (why that feature: :mod:`dml2comm.calibrate.classes`).
REGIME_CLASSES = ("gemm_large", "gemm_small", "gemm_unaligned", "conv")


def regime_key(name: str, lo: int, hi: int) -> str:
    """The :attr:`GPU.calibrated_classes` key of class ``name``'s value for GEMMs whose smallest
    dimension lies in ``[lo, hi]`` (``gemm_large@768..2048``)."""
    return f"{name}@{lo}..{hi}"


@functools.lru_cache(maxsize=1024)  # read on every GEMM shape the per-shape cache has not seen
def parse_class_key(key: str) -> tuple[str, tuple[int, int] | None]:
    """(class, its ``(lo, hi)`` range of ``min(M, N, K)`` or None) of a :attr:`GPU.calibrated_classes`
    key: a class name (its value applies to every kernel of the class) or :func:`regime_key`'s.

    Raises
    ------
    ConfigError
        Not a class, or a range that is not ``CLASS@LO..HI`` with integers 1 <= LO <= HI on a GEMM class.
    """
    name, at, rng = str(key).partition("@")
    if name not in CALIBRATED_CLASSES:
        raise ConfigError(f"unknown kernel class {key!r}; use one of {', '.join(CALIBRATED_CLASSES)} "
                          f"(a GEMM class may carry a range: {regime_key('gemm_large', 768, 2048)})")
    if not at:
        return name, None
    lo, dots, hi = rng.partition("..")
    if name not in REGIME_CLASSES or not dots or not (lo.isdigit() and hi.isdigit()) or not 1 <= int(lo) <= int(hi):
        raise ConfigError(f"key {key!r}: a range is CLASS@LO..HI on a GEMM class ({', '.join(REGIME_CLASSES)}) "
                          "with whole numbers 1 <= LO <= HI (the GEMMs' smallest dimension)")
    return name, (int(lo), int(hi))


def _frozen(mapping: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class GPU:
    """One accelerator model and its datasheet numbers (SI units, see the module docstring).

    Parameters
    ----------
    name
        Canonical name, e.g. ``"A100-SXM4-80GB"``.
    peak_flops_per_s
        Dense peak FLOP/s by key in :data:`DTYPE_KEYS` (``"fp32"`` = CUDA cores, others = tensor cores).
    hbm_bytes, hbm_bytes_per_s
        Device-memory capacity (bytes) and peak bandwidth (bytes/s).
    nvlink_bytes_per_s
        GPU-to-GPU line rate per direction summed over links; 0 for none.
    pcie_bytes_per_s
        Host-interface line rate per direction.
    sources
        Field name (``"peak_flops_per_s.<key>"`` for peaks) -> where the number comes from.
    sm_count
        Streaming multiprocessors (AMD: compute units) that run GEMM tiles; 0 when unknown.
        Read by the GEMM model (:mod:`dml2comm.cost.gemm`) for wave quantisation.
    l2_bytes
        Capacity of the L2 cache shared by the SMs, bytes; 0 when unknown.  Read by the eager
        LayerNorm/RMSNorm law (:mod:`dml2comm.cost.norm`: a row read twice comes from HBM once
        the resident rows exceed it); 0 takes the rows never to spill.
    gemm_sustained_factor
        Calibrated ``f_gpu`` of the GEMM model (:mod:`dml2comm.cost.gemm`) measured on this GPU
        by ``python main.py calibrate`` (:mod:`dml2comm.calibrate`); ``None`` (every preset): the
        model's own per-GPU value.  When set, the GEMM model uses its analytical law with this
        factor and no published table.
    hbm_efficiency
        Calibrated achieved / peak HBM bandwidth of memory-bound kernels (``calibrate``);
        ``None`` (every preset): :data:`dml2comm.cost.compute.HBM_EFFICIENCY`.
    calibrated_classes
        Calibrated values per kernel class (``calibrate``: :data:`dml2comm.cost.calibrated.CLASSES`,
        e.g. ``gemm_large`` -> sustained factor, ``norm`` -> HBM efficiency, ``attention_fwd`` ->
        time scale); a class named here overrides the two single fields above for its kernels
        (:mod:`dml2comm.cost.calibrated` reads them).  A GEMM class's value may be limited to a
        range of the GEMMs' smallest dimension (key ``gemm_large@768..2048``,
        :func:`regime_key`): it then applies only to GEMMs inside that range, the shapes it was
        fitted on.  Empty (every preset): none.
    kernel_bandwidth_share
        Share of ``hbm_bytes_per_s`` that memory-bound kernels reach on this GPU relative to the
        GPUs the kernel laws were measured on (the H100 and A100: 1.0): the cost model's
        memory-bound times divide by :attr:`kernel_hbm_bytes_per_s`.  The H200 streams a plain
        copy at its 4.8 TB/s datasheet rate but runs PyTorch's point-wise, norm and optimizer
        kernels only about 1.2 times as fast as the H100 (its preset's source says how this
        was measured).  1.0 for every other preset.

    Raises
    ------
    ConfigError
        A number is negative, not finite, or a peak key is not one of :data:`DTYPE_KEYS`.
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    hbm_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float
    sources: Mapping[str, str]
    sm_count: int = 0
    gemm_sustained_factor: float | None = None
    hbm_efficiency: float | None = None
    calibrated_classes: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    l2_bytes: float = 0.0
    kernel_bandwidth_share: float = 1.0

    def __post_init__(self) -> None:
        for key, value in self.peak_flops_per_s.items():
            if key not in DTYPE_KEYS:
                raise ConfigError(
                    f"GPU {self.name!r}: unknown peak-FLOP/s key {key!r}; use one of {', '.join(DTYPE_KEYS)}"
                )
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"GPU {self.name!r}: peak_flops_per_s[{key!r}] must be a positive number, got {value!r}")
        for field_name in _NUMERIC_FIELDS:
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"GPU {self.name!r}: {field_name} must be a non-negative number, got {value!r}")
        if isinstance(self.l2_bytes, bool) or not isinstance(self.l2_bytes, (int, float)) or not (math.isfinite(self.l2_bytes) and self.l2_bytes >= 0):
            raise ConfigError(f"GPU {self.name!r}: l2_bytes must be a non-negative number (0: unknown), got {self.l2_bytes!r}")
        if not (isinstance(self.sm_count, int) and self.sm_count >= 0):
            raise ConfigError(f"GPU {self.name!r}: sm_count must be a non-negative integer, got {self.sm_count!r}")
        if self.hbm_bytes <= 0 or self.hbm_bytes_per_s <= 0:
            raise ConfigError(f"GPU {self.name!r}: hbm_bytes and hbm_bytes_per_s must be positive")
        for field_name in ("gemm_sustained_factor", "hbm_efficiency"):
            value = getattr(self, field_name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not (math.isfinite(value) and 0 < value <= 1.5)):
                raise ConfigError(f"GPU {self.name!r}: {field_name} must be a number in (0, 1.5] or absent, got {value!r}")
        share = self.kernel_bandwidth_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not (math.isfinite(share) and 0 < share <= 1.5):
            raise ConfigError(f"GPU {self.name!r}: kernel_bandwidth_share must be a number in (0, 1.5], got {share!r}")
        for key, value in self.calibrated_classes.items():
            try:
                parse_class_key(key)
            except ConfigError as e:
                raise ConfigError(f"GPU {self.name!r}: calibrated_classes: {e}") from None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and 0 < value <= 10):
                raise ConfigError(f"GPU {self.name!r}: calibrated_classes[{key!r}] must be a number in (0, 10], got {value!r}")
        object.__setattr__(self, "calibrated_classes", _frozen(self.calibrated_classes))
        object.__setattr__(self, "peak_flops_per_s", _frozen(self.peak_flops_per_s))
        object.__setattr__(self, "sources", _frozen(self.sources))

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                tuple(sorted(self.peak_flops_per_s.items())),
                self.hbm_bytes,
                self.hbm_bytes_per_s,
                self.nvlink_bytes_per_s,
                self.pcie_bytes_per_s,
                tuple(sorted(self.sources.items())),
                self.sm_count,
                self.gemm_sustained_factor,
                self.hbm_efficiency,
                tuple(sorted(self.calibrated_classes.items())),
                self.l2_bytes,
                self.kernel_bandwidth_share,
            )
        )

    def __reduce__(self) -> tuple[object, ...]:
        # mappingproxy does not pickle; rebuild from plain dicts (copy, deepcopy, multiprocessing).
        return (
            type(self),
            (
                self.name,
                dict(self.peak_flops_per_s),
                self.hbm_bytes,
                self.hbm_bytes_per_s,
                self.nvlink_bytes_per_s,
                self.pcie_bytes_per_s,
                dict(self.sources),
                self.sm_count,
                self.gemm_sustained_factor,
                self.hbm_efficiency,
                dict(self.calibrated_classes),
                self.l2_bytes,
                self.kernel_bandwidth_share,
            ),
        )

    @property
    def kernel_hbm_bytes_per_s(self) -> float:
        """The bandwidth the cost model's memory-bound kernel laws run at on this GPU:
        ``hbm_bytes_per_s * kernel_bandwidth_share`` (the class docstring)."""
        return self.hbm_bytes_per_s * self.kernel_bandwidth_share

    def peak_flops(self, dtype: str, *, allow_tf32: bool = False) -> float:
        """Dense peak FLOP/s of matrix math in ``dtype``.

        ``"fp32"`` is ambiguous on Ampere and later: a float32 matmul runs on the CUDA cores
        (the ``"fp32"`` peak, e.g. 19.5 TFLOP/s on A100) unless the framework lets it use TF32
        tensor cores (156 TFLOP/s on A100).  PyTorch >= 1.12 defaults to the former for matmuls
        (``torch.backends.cuda.matmul.allow_tf32 = False``), so that is our default too; pass
        ``allow_tf32=True`` to model ``allow_tf32 = True`` / ``set_float32_matmul_precision("high")``.

        Parameters
        ----------
        dtype
            ``"fp32"``/``"float32"``, ``"tf32"``, ``"bf16"``/``"bfloat16"``, ``"fp16"``/``"float16"``,
            ``"fp8"``/``"float8"`` (case-insensitive).
        allow_tf32
            For ``"fp32"`` only: return the TF32 tensor-core peak instead of the CUDA-core peak.

        Returns
        -------
        float
            FLOP/s (a multiply-add counts 2).

        Raises
        ------
        ConfigError
            Unknown dtype, or no sourced peak for it on this GPU (e.g. bf16 on V100, which has no
            bf16 tensor cores; TF32 on V100, which has none) -- the message lists what is known.
        """
        key = _DTYPE_SPELLINGS.get(dtype.strip().lower())
        if key is None:
            raise ConfigError(
                f"unknown dtype {dtype!r} for peak FLOP/s; use one of {', '.join(sorted(_DTYPE_SPELLINGS))}"
            )
        via_allow_tf32 = key == "fp32" and allow_tf32
        if via_allow_tf32:
            key = "tf32"
        if key not in self.peak_flops_per_s:
            known = ", ".join(k for k in DTYPE_KEYS if k in self.peak_flops_per_s)
            hint = " (pass allow_tf32=False to use the FP32 CUDA-core peak)" if via_allow_tf32 else ""
            raise ConfigError(f"GPU {self.name} has no sourced {key} peak{hint}; known: {known}")
        return self.peak_flops_per_s[key]

    def unsourced_fields(self) -> tuple[str, ...]:
        """Names of numbers without a non-empty entry in :attr:`sources` (empty for every preset)."""
        wanted = [f"peak_flops_per_s.{k}" for k in self.peak_flops_per_s] + list(_NUMERIC_FIELDS)
        wanted += ["sm_count"] if self.sm_count else []
        wanted += ["l2_bytes"] if self.l2_bytes else []
        wanted += [k for k in ("gemm_sustained_factor", "hbm_efficiency") if getattr(self, k) is not None]
        wanted += ["calibrated_classes"] if self.calibrated_classes else []
        wanted += ["kernel_bandwidth_share"] if self.kernel_bandwidth_share != 1.0 else []
        return tuple(f for f in wanted if not str(self.sources.get(f, "")).strip())

    def to_dict(self) -> dict[str, object]:
        """Plain-data view (for ``presets`` output and data.json); the calibrated fields appear
        only when set."""
        calibrated: dict[str, object] = {k: getattr(self, k) for k in ("gemm_sustained_factor", "hbm_efficiency")
                                         if getattr(self, k) is not None}
        if self.calibrated_classes:
            calibrated["calibrated_classes"] = dict(sorted(self.calibrated_classes.items()))
        return {
            **calibrated,
            "name": self.name,
            "peak_flops_per_s": dict(self.peak_flops_per_s),
            "hbm_bytes": self.hbm_bytes,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "nvlink_bytes_per_s": self.nvlink_bytes_per_s,
            "pcie_bytes_per_s": self.pcie_bytes_per_s,
            "sm_count": self.sm_count,
            "l2_bytes": self.l2_bytes,
            **({"kernel_bandwidth_share": self.kernel_bandwidth_share} if self.kernel_bandwidth_share != 1.0 else {}),
            "sources": dict(self.sources),
        }


# --------------------------------------------------------------------------------------------
# Source strings shared by several presets
# --------------------------------------------------------------------------------------------

_A100_FLOPS = (
    "NVIDIA A100 datasheet / Ampere whitepaper, tabulated at glennklockwood.com/garden/processors/A100: "
    "FP32 19.5, TF32 tensor 156 (312 sparse), BF16/FP16 tensor 312 (624 sparse) TFLOP/s; "
    "312 also in Narayanan et al. 2021 Sec. 5 ('peak device throughput of an A100 GPU with 16-bit precision')"
)
_A100_NVLINK = (
    "12 NVLink3 links x 25 GB/s per direction = 300 GB/s (sjeaugey, NVIDIA/nccl-tests#149; "
    "'300+300 GB/s NVLink', glennklockwood.com/garden/processors/A100)"
)
_A100_PCIE = "PCIe Gen4 x16, '32+32 GB/s PCIe Gen4' (glennklockwood.com/garden/processors/A100)"
_H100_FLOPS = (
    "NVIDIA H100 SXM5 whitepaper table at glennklockwood.com/garden/processors/h100 (FP32 66.9; dense "
    "TF32 494.7, BF16/FP16 989.4, FP8 1978.9 TFLOP/s; the sparse figures are 2x); datasheet as "
    "reproduced by hpctech.co.jp: FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958* with '*with sparsity, "
    "specifications 1/2 lower without sparsity'"
)
_H100_NVLINK = (
    "NVLink4: 900 GB/s bidirectional (NVIDIA 'Introducing NVIDIA HGX H100' blog), 450 GB/s per "
    "direction is the line rate (sjeaugey, NVIDIA/nccl-tests#212)"
)
_H100_PCIE = "PCIe Gen5 x16, '128 GB/s PCIe Gen5' bidirectional = 64 GB/s per direction (glennklockwood.com/garden/processors/h100)"

_A100_80 = GPU(
    name="A100-SXM4-80GB",
    peak_flops_per_s={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    hbm_bytes=80e9,
    hbm_bytes_per_s=2039e9,
    nvlink_bytes_per_s=300e9,
    pcie_bytes_per_s=32e9,
    sm_count=108,
    l2_bytes=40e6,
    sources={
        "sm_count": "108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020: the A100 product enables 108 of the GA100 die's 128 SMs)",
        "l2_bytes": "40 MB L2 (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020: '40 MB L2 cache', 7x V100's)",
        "peak_flops_per_s.fp32": _A100_FLOPS,
        "peak_flops_per_s.tf32": _A100_FLOPS,
        "peak_flops_per_s.bf16": _A100_FLOPS,
        "peak_flops_per_s.fp16": _A100_FLOPS,
        "hbm_bytes": "80 GB HBM2e (Narayanan et al. 2021 Sec. 5 / Korthikanti et al. 2022: '8 NVIDIA 80GB A100 GPUs')",
        "hbm_bytes_per_s": "2,039 GB/s for A100 SXM 80GB (glennklockwood.com/garden/processors/A100; thundercompute.com A100 specs table)",
        "nvlink_bytes_per_s": _A100_NVLINK,
        "pcie_bytes_per_s": _A100_PCIE,
    },
)

_A100_40 = GPU(
    name="A100-SXM4-40GB",
    peak_flops_per_s=dict(_A100_80.peak_flops_per_s),
    hbm_bytes=40e9,
    hbm_bytes_per_s=1555e9,
    nvlink_bytes_per_s=300e9,
    pcie_bytes_per_s=32e9,
    sm_count=_A100_80.sm_count,
    l2_bytes=_A100_80.l2_bytes,
    sources={
        **dict(_A100_80.sources),
        "hbm_bytes": "40 GB HBM2 (glennklockwood.com/garden/processors/A100: 'A100 40G SXM4 ... 40 GB HBM2')",
        "hbm_bytes_per_s": "1,555 GB/s (glennklockwood.com/garden/processors/A100; thundercompute.com A100 specs table)",
    },
)

_H100 = GPU(
    name="H100-SXM5-80GB",
    peak_flops_per_s={"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12},
    hbm_bytes=80e9,
    hbm_bytes_per_s=3350e9,
    nvlink_bytes_per_s=450e9,
    pcie_bytes_per_s=64e9,
    sm_count=132,
    l2_bytes=50e6,
    sources={
        "sm_count": "132 SMs for H100 SXM5 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022: 132 SMs on SXM5, 114 on PCIe)",
        "l2_bytes": "50 MB L2 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022: '50 MB L2 cache' on H100 SXM5)",
        "peak_flops_per_s.fp32": _H100_FLOPS,
        "peak_flops_per_s.tf32": _H100_FLOPS,
        "peak_flops_per_s.bf16": _H100_FLOPS,
        "peak_flops_per_s.fp16": _H100_FLOPS,
        "peak_flops_per_s.fp8": _H100_FLOPS,
        "hbm_bytes": "80 GB HBM3 (H100 SXM datasheet as reproduced by hpctech.co.jp; glennklockwood.com/garden/processors/h100)",
        "hbm_bytes_per_s": "3,350 GB/s (H100 SXM datasheet as reproduced by hpctech.co.jp: 'GPU memory bandwidth 3,350 GB/sec')",
        "nvlink_bytes_per_s": _H100_NVLINK,
        "pcie_bytes_per_s": _H100_PCIE,
    },
)

_H200 = GPU(
    name="H200-SXM-141GB",
    peak_flops_per_s=dict(_H100.peak_flops_per_s),
    hbm_bytes=141e9,
    hbm_bytes_per_s=4800e9,
    nvlink_bytes_per_s=450e9,
    pcie_bytes_per_s=64e9,
    sm_count=132,
    l2_bytes=50e6,
    kernel_bandwidth_share=0.853,
    sources={
        "kernel_bandwidth_share": (
            "0.853: measured for this project (2026-11-28, benchmarks/data/gpu_steps/, PROVENANCE.md there) on one H200 and one "
            "H100 SXM with PyTorch 2.11: the same memory-bound kernels on both (tanh-GELU and LayerNorm forward and "
            "forward+backward at 5 shapes each, fused AdamW at 4 sizes: 19 rows), the H100's time over the H200's divided by the "
            "datasheet ratio 4.8 / 3.35: median 0.853 over the 19 rows (GELU 0.82-0.86, LayerNorm 0.72-0.91, AdamW 0.84-0.93; a plain "
            "copy reaches 0.99, the datasheet rate); leave-one-kernel-out, the other kernels' median predicts the left-out "
            "kernel's times within 2% (GELU), 6% (AdamW), 9% (LayerNorm forward+backward) and 12% (LayerNorm forward) on average"
        ),
        "sm_count": "132 SMs: the same GH100 configuration as H100 SXM5 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022; H200 = H100 with HBM3e, glennklockwood.com/garden/processors/h100)",
        "l2_bytes": "50 MB L2: the same GH100 configuration as H100 SXM5 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022: '50 MB L2 cache'; H200 = H100 with HBM3e)",
        **{
            f"peak_flops_per_s.{k}": (
                "same GH100 compute as H100 SXM5 ('H200 GPUs are the same as H100 GPUs ... just with more and "
                "faster HBM', glennklockwood.com/garden/processors/h100): " + _H100_FLOPS
            )
            for k in _H100.peak_flops_per_s
        },
        "hbm_bytes": "141 GB HBM3e (MLCommons inference_results_v4.1 closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json)",
        "hbm_bytes_per_s": "4.8 TB/s (NVIDIA H200 specification pages; shared/data/hardware_presets_sources.json, SECONDARY)",
        "nvlink_bytes_per_s": "18x 4th Gen NVLink, 900 GB/s bidirectional = 450 GB/s per direction (MLCommons H200-SXM-141GBx8 system JSON)",
        "pcie_bytes_per_s": "PCIe Gen5 x16 as on H100 SXM5 (H200 = H100 with HBM3e, glennklockwood.com/garden/processors/h100): " + _H100_PCIE,
    },
)

_V100 = GPU(
    name="V100-SXM2-32GB",
    peak_flops_per_s={"fp32": 15.7e12, "fp16": 125e12},
    hbm_bytes=32e9,
    hbm_bytes_per_s=900e9,
    nvlink_bytes_per_s=150e9,
    pcie_bytes_per_s=16e9,
    sm_count=80,
    l2_bytes=6144 * 1024,
    sources={
        "sm_count": "80 SMs (NVIDIA Tesla V100 GPU Architecture whitepaper, 2017)",
        "l2_bytes": "6,144 KB L2 (NVIDIA Tesla V100 GPU Architecture whitepaper, 2017, Table 1)",
        "peak_flops_per_s.fp32": "NVIDIA Tesla V100 datasheet, SXM2: single precision 15.7 TFLOP/s (double 7.8)",
        "peak_flops_per_s.fp16": (
            "NVIDIA Tesla V100 datasheet, SXM2: 'Tensor Performance 125 TFLOPS'; NVIDIA developer blog "
            "'Programming Tensor Cores in CUDA 9' (up to 125 Tensor TFLOPS). Volta has no bf16/TF32 tensor cores"
        ),
        "hbm_bytes": "32 GB HBM2 (V100-SXM2-32GB variant; the 16 GB variant also exists; spec pages, SECONDARY)",
        "hbm_bytes_per_s": "900 GB/s (V100 datasheet; llm-analysis preset; shared/data/hardware_presets_sources.json, SECONDARY)",
        "nvlink_bytes_per_s": (
            "six NVLink2 links, 'each providing a point-to-point connection to another GPU at a peak bandwidth of "
            "25 GB/s in each direction' = 150 GB/s (NVIDIA DGX-1 with V100 system-architecture whitepaper)"
        ),
        "pcie_bytes_per_s": (
            "PCIe 3.0 x16 ('V100 also supports 16 lanes of PCIe 3.0', DGX-1 whitepaper): 8 GT/s x 16 lanes / 8 = "
            "16 GB/s per direction before 128b/130b encoding"
        ),
    },
)

_A6000 = GPU(
    name="RTX-A6000",
    peak_flops_per_s={"fp32": 38.7e12, "bf16": 154.8e12, "fp16": 154.8e12},
    hbm_bytes=48e9,
    hbm_bytes_per_s=768e9,
    nvlink_bytes_per_s=56.25e9,
    pcie_bytes_per_s=32e9,
    sm_count=84,
    l2_bytes=6144 * 1024,
    sources={
        "sm_count": "84 SMs (NVIDIA Ampere GA102 GPU Architecture whitepaper, 2021: RTX A6000 is the full GA102 with 84 SMs)",
        "l2_bytes": "6,144 KB L2 (NVIDIA Ampere GA102 GPU Architecture whitepaper, 2021: full GA102, '6144 KB' L2)",
        "peak_flops_per_s.fp32": "NVIDIA RTX A6000 datasheet: single-precision 38.7 TFLOP/s (also 38.71 in TechPowerUp-derived tables)",
        "peak_flops_per_s.bf16": (
            "Microway 'In-Depth Comparison of NVIDIA Ampere GPU Accelerators': RTX A6000 FP16/BF16 tensor 154.8 "
            "TFLOP/s dense (309.7 with sparsity, the datasheet's 'Tensor Performance'). No TF32 figure was found, "
            "so the preset has no 'tf32' key"
        ),
        "peak_flops_per_s.fp16": "Microway 'In-Depth Comparison of NVIDIA Ampere GPU Accelerators': 154.8 TFLOP/s dense (309.7 sparse)",
        "hbm_bytes": "48 GB GDDR6 with ECC (NVIDIA RTX A6000 spec table reproduced by servethehome.com)",
        "hbm_bytes_per_s": "768 GB/s GDDR6 (NVIDIA RTX A6000 spec table reproduced by servethehome.com)",
        "nvlink_bytes_per_s": (
            "2-way NVLink bridge only: 'NVLink Interconnect 112.5 GB/s (bidirectional), Connect 2x RTX A6000' = "
            "56.25 GB/s per direction (NVIDIA spec table, servethehome.com). No NVSwitch: it joins pairs of GPUs; "
            "the pcie-a6000 cluster preset uses PCIe for every intra-node group"
        ),
        "pcie_bytes_per_s": "PCI Express 4.0 x16 (NVIDIA spec table, servethehome.com): 16 GT/s x 16 / 8 = 32 GB/s per direction",
    },
)

_L40S = GPU(
    name="L40S",
    peak_flops_per_s={"fp32": 91.6e12, "tf32": 183e12, "bf16": 362.05e12, "fp16": 362.05e12, "fp8": 733e12},
    hbm_bytes=48e9,
    hbm_bytes_per_s=864e9,
    nvlink_bytes_per_s=0.0,
    pcie_bytes_per_s=32e9,
    sm_count=142,
    l2_bytes=96 * 1024 * 1024,
    sources={
        "sm_count": "142 SMs (NVIDIA ADA GPU Architecture whitepaper, 2023: L40S/L40 enable 142 of AD102's 144 SMs)",
        "l2_bytes": "96 MB L2 (NVIDIA ADA GPU Architecture whitepaper, 2023: AD102's 98,304 KB L2; L40S datasheet '96 MB L2 cache')",
        **{
            f"peak_flops_per_s.{k}": (
                "NVIDIA L40S datasheet table (reproduced by mullet.se): FP32 91.6; TF32 183 (366*); BF16/FP16 "
                "362.05 (733*); FP8 733 (1,466*) TFLOP/s, '* With Sparsity'"
            )
            for k in ("fp32", "tf32", "bf16", "fp16", "fp8")
        },
        "hbm_bytes": "48 GB GDDR6 with ECC (NVIDIA L40S datasheet table, mullet.se / itcreations.com)",
        "hbm_bytes_per_s": "864 GB/s (NVIDIA L40S datasheet table, mullet.se / itcreations.com)",
        "nvlink_bytes_per_s": "none: 'NVLink is not supported' (itcreations.com L40S page); the datasheet lists PCIe only",
        "pcie_bytes_per_s": "'PCIe Gen4 x16: 64GB/s bidirectional' = 32 GB/s per direction (NVIDIA L40S datasheet table)",
    },
)

_MI300X_FLOPS = (
    "AMD ROCm documentation 'AMD Instinct MI300 series microarchitecture', table 'Peak-performance "
    "capabilities of the MI300X': Vector/Matrix FP32 163.4, TF32 653.7, Matrix FP16/BF16 1307.4, "
    "Matrix FP8 2614.9 TFLOP/s (dense)"
)
# l2_bytes left 0 (unknown): CDNA 3 has 4 MB of L2 per XCD and a 256 MB Infinity Cache, not one L2 shared
# by every CU (AMD CDNA 3 Architecture white paper, 2023), and the eager norm law is CUDA's kernels'.
_MI300X = GPU(
    name="MI300X",
    peak_flops_per_s={"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12},
    hbm_bytes=192e9,
    hbm_bytes_per_s=5300e9,
    nvlink_bytes_per_s=448e9,
    pcie_bytes_per_s=64e9,
    sm_count=304,
    sources={
        "sm_count": "304 compute units (AMD CDNA 3 Architecture white paper, 2023; AMD ROCm 'MI300 series microarchitecture' table)",
        **{f"peak_flops_per_s.{k}": _MI300X_FLOPS for k in ("fp32", "tf32", "bf16", "fp16", "fp8")},
        "hbm_bytes": "192 GB HBM3 (MLCommons system name 'MI300X-NPS1-SPX-192GB-750W'; spec pages, SECONDARY)",
        "hbm_bytes_per_s": "'theoretical aggregated peak memory bandwidth of the GPU is 5.3 TB per second' (AMD ROCm MI300 microarchitecture docs)",
        "nvlink_bytes_per_s": (
            "Infinity Fabric (xGMI), not NVLink: seven links per GPU forming a fully connected 8-GPU system (AMD ROCm "
            "MI300 docs); 128 GB/s bidirectional per link (emergentmind MI300X summary), 896 GB/s aggregate "
            "bidirectional (gpu.blog) -> 7 x 64 = 448 GB/s per direction. SECONDARY: AMD datasheet not found"
        ),
        "pcie_bytes_per_s": "PCIe Gen 5 x16 host links (AMD ROCm MI300 node-level architecture): 32 GT/s x 16 / 8 = 64 GB/s per direction",
    },
)

#: Presets by canonical name (read-only).
GPUS: Mapping[str, GPU] = MappingProxyType({g.name: g for g in (_A100_80, _A100_40, _H100, _H200, _V100, _A6000, _L40S, _MI300X)})

#: Short names accepted by :func:`get_gpu` (case-insensitive) -> canonical name.
GPU_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "a100": "A100-SXM4-80GB",
        "a100-80gb": "A100-SXM4-80GB",
        "a100-sxm4-80gb": "A100-SXM4-80GB",
        "a100-40gb": "A100-SXM4-40GB",
        "a100-sxm4-40gb": "A100-SXM4-40GB",
        "h100": "H100-SXM5-80GB",
        "h100-sxm": "H100-SXM5-80GB",
        "h100-sxm5-80gb": "H100-SXM5-80GB",
        "h200": "H200-SXM-141GB",
        "h200-sxm-141gb": "H200-SXM-141GB",
        "v100": "V100-SXM2-32GB",
        "v100-sxm2-32gb": "V100-SXM2-32GB",
        "a6000": "RTX-A6000",
        "rtx-a6000": "RTX-A6000",
        "l40s": "L40S",
        "mi300x": "MI300X",
    }
)


#: What ``calibrate`` appends to the base GPU's name in a calibrated cluster file
#: (``A100-SXM4-80GB cal-1a2b3c4d``, the suffix a hash of the fitted values).
CALIBRATED_SUFFIX = " cal-"


def base_gpu_name(name: str) -> str:
    """The preset GPU a calibrated one was fitted from (the name before :data:`CALIBRATED_SUFFIX`);
    any other name as it is."""
    return name.split(CALIBRATED_SUFFIX)[0]


def gpu_names() -> tuple[str, ...]:
    """Every name :func:`get_gpu` accepts (aliases), sorted."""
    return tuple(sorted(GPU_ALIASES))


def get_gpu(name: str) -> GPU:
    """The preset called ``name`` (case-insensitive; ``_`` and spaces read as ``-``).

    Raises
    ------
    ConfigError
        Unknown name; the message lists the valid names.
    """
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    canonical = GPU_ALIASES.get(key)
    if canonical is None:
        raise ConfigError(
            f"unknown GPU {name!r}; valid names: {', '.join(gpu_names())} "
            "(or build a dml2comm.hardware.GPU with your own sourced numbers)"
        )
    return GPUS[canonical]
