"""CPU topology, read once here: which cores we may run on, how core lists are written and split, the
processor's flags and the machine facts every server record and benchmark carries."""

from __future__ import annotations

import os
from pathlib import Path

from models.errors import MedstackError

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # native bfloat16 arithmetic (AVX-512 BF16 dot products, AMX tiles)


def cpu_list(cpus) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the syntax VLLM_CPU_OMP_THREADS_BIND takes)."""
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpu_list(cpus: str) -> list[int]:
    """"0-2,5" -> [0, 1, 2, 5] (the inverse of :func:`cpu_list`)."""
    out = []
    for part in filter(None, cpus.split(",")):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def split_cpus(cpus: list[int], groups: int, what: str = "worker") -> list[list[int]]:
    """Split ``cpus`` into ``groups`` contiguous, disjoint lists, as even as possible (the first ones get the extra cores)."""
    cpus = sorted(set(cpus))
    if groups < 1:
        raise MedstackError(f"cannot split cores into {groups} groups")
    if len(cpus) < groups:
        raise MedstackError(f"{groups} {what}s need at least one core each, but only {len(cpus)} are usable here ({cpus})")
    size, extra = divmod(len(cpus), groups)
    out, i = [], 0
    for g in range(groups):
        n = size + (1 if g < extra else 0)
        out.append(cpus[i:i + n])
        i += n
    return out


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The processor's feature flags (the first ``flags`` line of /proc/cpuinfo); empty where it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, val = (x.strip() for x in line.partition(":"))
        if key == "flags":
            return set(val.split())
    return set()


def machine_facts() -> dict:
    """CPU model, logical CPUs, the CPUs we may run on, physical cores, vector ISA, memory."""
    facts: dict = {"cpu_model": None, "logical_cpus": os.cpu_count(), "usable_cpus": cpu_list(usable_cpus())}
    cores = set()
    try:
        phys = core = None
        cpuinfo = Path("/proc/cpuinfo").read_text()
        flags = cpu_flags(cpuinfo)
        for line in cpuinfo.splitlines():
            key, _, val = (x.strip() for x in line.partition(":"))
            if key == "model name" and facts["cpu_model"] is None:
                facts["cpu_model"] = val
            elif key == "physical id":
                phys = val
            elif key == "core id":
                core = val
                cores.add((phys, core))
            elif key == "cpu MHz" and "cpu_mhz" not in facts:
                facts["cpu_mhz"] = float(val)
        facts["physical_cores"] = len(cores) or None
        facts["isa"] = [f for f in ("avx2", "avx512f", *BF16_FLAGS) if f in flags]
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                facts["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return facts


def host_facts() -> dict:
    """:func:`machine_facts` with ``cpus`` (the logical CPU count, as benchmark results have named it)."""
    return {"cpus": os.cpu_count(), **machine_facts()}
