"""EMULATED nvidia-smi for pdboot's testbed hosts (no GPU here): answers from the host's
profile (JSON at $PDT_PROFILE) in the formats of the real capture in
shared/fixtures/h200-host/ (table, -L, --version, --query-gpu/--query-compute-apps CSV,
-q, -i, topo -m, the error messages and exit codes of variants.txt). Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
W = 89  # inner width of the wide table lines


class Exit(Exception):
    def __init__(self, code: int, text: str = "") -> None:
        self.code, self.text = code, text


def load_profile() -> dict[str, Any]:
    path = Path(os.environ["PDT_PROFILE"])
    return with_engines(dict(json.loads(path.read_text())), engine_processes(path))


def engine_processes(profile_path: Path) -> list[dict[str, Any]]:
    """The processes the toolkit hook recorded as holding GPU memory (nvidia_hook.py) that
    still live in their container: the pid exists and its cgroup names the container (a
    stopped container's pid is gone or reused by another process)."""
    out: list[dict[str, Any]] = []
    for rec in sorted((profile_path.parent / "gpu-procs").glob("*.json")):
        try:
            r = json.loads(rec.read_text())
            cgroup = Path(f"/proc/{int(r['pid'])}/cgroup").read_text()
            comm = Path(f"/proc/{int(r['pid'])}/comm").read_text().strip()
        except (OSError, ValueError, KeyError):
            continue
        if str(r["id"]) not in cgroup:
            continue
        for index, mib in r["memory_mib"].items():
            out.append(
                {
                    "gpu": int(index),
                    "pid": int(r["pid"]),
                    "type": "C",
                    "name": comm,
                    "used_memory": int(mib),
                }
            )
    return out


def with_engines(p: dict[str, Any], engines: list[dict[str, Any]]) -> dict[str, Any]:
    """The profile with the engines' processes listed and their memory counted as used."""
    if not engines:
        return p
    gpus = []
    for g in p["gpus"]:
        held = sum(e["used_memory"] for e in engines if e["gpu"] == g["index"])
        g = dict(g, memory_used=g["memory_used"] + held)
        if "memory_free" in g:
            g["memory_free"] = max(0, g["memory_free"] - held)
        gpus.append(g)
    return dict(p, gpus=gpus, processes=[*p.get("processes", []), *engines])


def driver_major(p: dict[str, Any]) -> int:
    return int(str(p["driver"]).split(".")[0])


# ---------------------------------------------------------------------- the default table


def table(p: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    out = [time.strftime("%a %b %e %H:%M:%S %Y") + "       "]
    bar = "+" + "-" * W + "+"
    out.append(bar)
    out.append(
        f"| NVIDIA-SMI {p['driver']:<23}Driver Version: {p['driver']:<15}"
        f"CUDA Version: {p['cuda']:<9}|"
    )
    sep = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    out.append(("|" + sep[1:]) if driver_major(p) < 580 else sep)
    out.append(
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A "
        "| Volatile Uncorr. ECC |"
    )
    out.append(
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage "
        "| GPU-Util  Compute M. |"
    )
    out.append(
        "|                                         |                        "
        "|               MIG M. |"
    )
    out.append(
        "|=========================================+========================"
        "+======================|"
    )
    for g in gpus:
        name = g["name"] if len(g["name"]) <= 27 else g["name"][:24] + "..."
        pm = "On" if g["persistence_mode"] == "Enabled" else "Off"
        if g["ecc_mode"] == "Enabled":
            ecc = str(g["ecc_errors_uncorrected"])
        else:
            ecc = "Off" if g["ecc_mode"] == "Disabled" else "N/A"
        mig_on = g["mig_mode"] == "Enabled"
        mig = g["mig_mode"] if g["mig_mode"] in ("Enabled", "Disabled") else "N/A"
        fan = g["fan"] if g["fan"] == "N/A" else f"{g['fan']}%"
        mem = (
            f"{'N/A':>21}   "
            if mig_on
            else f"{str(g['memory_used']) + 'MiB':>11} / {str(g['memory_total']) + 'MiB':>9} "
        )
        util = "N/A" if mig_on else f"{g['utilization']}%"
        out.append(
            f"|{g['index']:>4}  {name:<27}{pm:>6}  |{g['bus_id']:>19} "
            f"{g['display_active']:>3} |{ecc:>21} |"
        )
        out.append(
            f"|{fan:>4}{str(g['temperature']) + 'C':>6}{g['pstate']:>6}"
            f"{str(int(g['power_draw'])) + 'W':>16} / "
            f"{str(int(g['power_limit'])) + 'W':>5} "
            f"|{mem}|{util:>8}{g['compute_mode']:>13} |"
        )
        out.append(f"|{'':41}|{'':24}|{mig:>21} |")
        out.append(sep)
    if p.get("mig_devices"):
        out += ["", bar, "| MIG devices:" + " " * (W - 13) + "|", _MIG_HEAD]
        for m in p["mig_devices"]:
            out.append(
                f"|{m['gpu']:>3}{m['gi']:>5}{m['ci']:>4}{m['dev']:>4}  |"
                f"{str(m['memory_used']) + 'MiB':>19} / "
                f"{str(m['memory_total']) + 'MiB':>8}"
                f"    |{m['sm']:>3}{'N/A':>7} |  1   1    1    0    1 |"
            )
            out.append(
                f"|{'':18}|{str(m['bar1_used']) + 'MiB':>19} / "
                f"{str(m['bar1_total']) + 'MiB':>8}    |{'':11}|{'':23}|"
            )
            out.append(_MIG_SEP)
    out += ["", bar, "| Processes:" + " " * (W - 11) + "|"]
    old = driver_major(p) < 560
    if old:
        out.append(
            "|  GPU   GI   CI        PID   Type   Process name"
            "                              GPU Memory |"
        )
    else:
        out.append(
            "|  GPU   GI   CI              PID   Type   Process name"
            "                        GPU Memory |"
        )
    out.append("|        ID   ID" + " " * 63 + "Usage      |")
    out.append("|" + "=" * W + "|")
    indices = {g["index"] for g in gpus}
    rows = [pr for pr in p.get("processes", []) if pr["gpu"] in indices]
    if not rows:
        out.append("|  No running processes found" + " " * (W - 28) + "|")
    for pr in rows:
        pid = f"{pr['pid']:>10}" if old else f"{pr['pid']:>16}"
        name = pr["name"] if len(pr["name"]) <= 38 else "..." + pr["name"][-35:]
        left = f"|{pr['gpu']:>5}{'N/A':>6}{'N/A':>5}{pid}{pr['type']:>7}   "
        mem = f"{pr['used_memory']}MiB"
        out.append(left + name + " " * (W - len(left) + 1 - len(name) - len(mem) - 1) + mem + " |")
    out.append(bar)
    return "\n".join(out) + "\n"


_MIG_HEAD = """+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |
|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |
|                  |                                  |        ECC|                       |
|==================+==================================+===========+=======================|"""
_MIG_SEP = (
    "+------------------+----------------------------------+-----------+-----------------------+"
)


# ---------------------------------------------------------------------- CSV queries


def _field_table() -> dict[str, str]:
    """Every accepted name -> its canonical (first) name, from the real --help-query-gpu."""
    names: dict[str, str] = {}
    for line in (DATA / "query_gpu_fields.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            parts = line.split()
            for n in parts:
                names[n] = parts[0]
    return names


UNITS = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "memory.reserved": "MiB",
    "power.draw": "W",
    "power.limit": "W",
    "enforced.power.limit": "W",
    "power.default_limit": "W",
    "power.min_limit": "W",
    "power.max_limit": "W",
    "power.draw.average": "W",
    "power.draw.instant": "W",
    "clocks.current.graphics": "MHz",
    "clocks.current.sm": "MHz",
    "clocks.current.memory": "MHz",
    "clocks.max.graphics": "MHz",
    "clocks.max.sm": "MHz",
    "clocks.max.memory": "MHz",
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "fan.speed": "%",
}


def gpu_value(p: dict[str, Any], g: dict[str, Any], f: str, count: int) -> str:
    bus = g["bus_id"]
    free = g.get("memory_free", g["memory_total"] - g["memory_used"] - g.get("memory_reserved", 0))
    values: dict[str, Any] = {
        "timestamp": time.strftime("%Y/%m/%d %H:%M:%S.") + f"{int(time.time() * 1000) % 1000:03d}",
        "driver_version": p["driver"],
        "count": count,
        "name": g["name"],
        "serial": g.get("serial", "[N/A]"),
        "uuid": g["uuid"],
        "pci.bus_id": bus,
        "pci.domain": "0x" + bus[4:8],
        "pci.bus": "0x" + bus[9:11],
        "pci.device": "0x" + bus[12:14],
        "index": g["index"],
        "display_active": "Disabled",
        "display_mode": "Requested functionality has been deprecated",
        "persistence_mode": g["persistence_mode"],
        "mig.mode.current": g["mig_mode"],
        "mig.mode.pending": g["mig_mode"],
        "ecc.mode.current": g["ecc_mode"],
        "ecc.mode.pending": g["ecc_mode"],
        "memory.total": g["memory_total"],
        "memory.used": g["memory_used"],
        "memory.free": free,
        "memory.reserved": g.get("memory_reserved", 0),
        "compute_cap": g["compute_cap"],
        "power.draw": f"{g['power_draw']:.2f}",
        "power.draw.instant": f"{g['power_draw']:.2f}",
        "power.draw.average": f"{g['power_draw']:.2f}",
        "power.limit": f"{g['power_limit']:.2f}",
        "enforced.power.limit": f"{g['power_limit']:.2f}",
        "power.default_limit": f"{g['power_limit']:.2f}",
        "power.max_limit": f"{g['power_limit']:.2f}",
        "clocks.max.sm": g["clocks_max_sm"],
        "clocks.max.graphics": g["clocks_max_sm"],
        "clocks.current.sm": g["clocks_max_sm"],
        "clocks.current.graphics": g["clocks_max_sm"],
        "temperature.gpu": g["temperature"],
        "utilization.gpu": g["utilization"],
        "utilization.memory": 0,
        "fan.speed": "[N/A]" if g["fan"] == "N/A" else g["fan"],
        "pstate": g["pstate"],
        "compute_mode": g["compute_mode"],
        "pcie.link.gen.max": g["pcie_gen_max"],
        "pcie.link.gen.current": g["pcie_gen_max"],
        "pcie.link.gen.gpumax": g["pcie_gen_max"],
        "pcie.link.width.max": g["pcie_width_max"],
        "pcie.link.width.current": g["pcie_width_max"],
        "vbios_version": g.get("vbios", "[N/A]"),
        "inforom.img": g.get("inforom_img", "[N/A]"),
    }
    for kind in ("corrected", "uncorrected"):
        for scope in ("volatile", "aggregate"):
            n = g["ecc_errors_uncorrected"] if kind == "uncorrected" else 0
            values[f"ecc.errors.{kind}.{scope}.total"] = (
                n if g["ecc_mode"] == "Enabled" else "[N/A]"
            )
    return str(values.get(f, "[N/A]"))


def parse_format(fmt: str | None) -> tuple[bool, bool]:
    """(header, units) from --format; raises Exit like the real tool."""
    if fmt is None:
        return True, True
    mods = fmt.split(",")
    if mods[0] != "csv":
        raise Exit(2, "Format modifier is not recognized.\n")
    header, units = True, True
    for m in mods[1:]:
        if m == "noheader":
            header = False
        elif m == "nounits":
            units = False
        else:
            raise Exit(2, "Format modifier is not recognized.\n")
    return header, units


def query_gpu(p: dict[str, Any], gpus: list[dict[str, Any]], fields: str, fmt: str | None) -> str:
    table_ = _field_table()
    wanted = fields.split(",")
    for f in wanted:
        if f not in table_:
            raise Exit(2, f'Field "{f}" is not a valid field to query.\n\n')
    header, units = parse_format(fmt)
    canon = [table_[f] for f in wanted]
    lines = []
    if header:
        lines.append(", ".join(f"{c} [{UNITS[c]}]" if c in UNITS else c for c in canon))
    for g in gpus:
        row = []
        for c in canon:
            v = gpu_value(p, g, c, len(p["gpus"]))
            if units and c in UNITS and not v.startswith("["):
                v = f"{v} {UNITS[c]}" if UNITS[c] != "%" else f"{v} %"
            row.append(v)
        lines.append(", ".join(row))
    return "".join(line + "\n" for line in lines)


APP_FIELDS = {
    "timestamp": "timestamp",
    "gpu_name": "gpu_name",
    "gpu_bus_id": "gpu_bus_id",
    "gpu_serial": "gpu_serial",
    "gpu_uuid": "gpu_uuid",
    "pid": "pid",
    "process_name": "process_name",
    "name": "process_name",
    "used_gpu_memory": "used_gpu_memory",
    "used_memory": "used_gpu_memory",
}


def query_apps(p: dict[str, Any], gpus: list[dict[str, Any]], fields: str, fmt: str | None) -> str:
    wanted = fields.split(",")
    for f in wanted:
        if f not in APP_FIELDS:
            raise Exit(2, f'Field "{f}" is not a valid field to query.\n\n')
    header, units = parse_format(fmt)
    canon = [APP_FIELDS[f] for f in wanted]
    lines = []
    if header:
        lines.append(", ".join(f"{c} [MiB]" if c == "used_gpu_memory" else c for c in canon))
    by_index = {g["index"]: g for g in gpus}
    for pr in p.get("processes", []):
        g = by_index.get(pr["gpu"])
        if g is None or pr.get("type") == "G":
            continue
        vals = {
            "timestamp": time.strftime("%Y/%m/%d %H:%M:%S.000"),
            "gpu_name": g["name"],
            "gpu_bus_id": g["bus_id"],
            "gpu_serial": g.get("serial", "[N/A]"),
            "gpu_uuid": g["uuid"],
            "pid": str(pr["pid"]),
            "process_name": pr["name"],
            "used_gpu_memory": f"{pr['used_memory']} MiB" if units else str(pr["used_memory"]),
        }
        lines.append(", ".join(vals[c] for c in canon))
    return "".join(line + "\n" for line in lines)


# ---------------------------------------------------------------------- other forms


def list_gpus(p: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        for m in p.get("mig_devices", []):
            if m["gpu"] == g["index"]:
                uuid = f"MIG-{g['uuid'][4:12]}-{m['gi']:04d}-{m['ci']:04d}-0000-{m['dev']:012d}"
                out.append(
                    f"  MIG {m.get('profile', '1g.24gb'):<11} Device {m['dev']:>2}: (UUID: {uuid})"
                )
    return "".join(line + "\n" for line in out)


def version(p: dict[str, Any]) -> str:
    return (
        f"NVIDIA-SMI version  : {p['driver']}\nNVML version        : {p['nvml']}\n"
        f"DRIVER version      : {p['driver']}\nCUDA Version        : {p['cuda']}\n"
    )


def query_q(p: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    """-q: the H200 capture's layout with this profile's values put in."""
    template = (DATA / "q_h200.txt").read_text().splitlines()
    head_end = next(i for i, line in enumerate(template) if line.startswith("GPU 0000"))
    head = template[:head_end]
    block = template[head_end:]
    out = []
    for line in head:
        key = line.split(":")[0].strip()
        if key == "Timestamp":
            line = _set(line, time.strftime("%a %b %e %H:%M:%S %Y"))
        elif key == "Driver Version":
            line = _set(line, p["driver"])
        elif key == "CUDA Version":
            line = _set(line, p["cuda"])
        elif key == "Attached GPUs":
            line = _set(line, str(len(p["gpus"])))
        out.append(line)
    for g in gpus:
        section = ""
        for line in block:
            if line.startswith("GPU 0000"):
                out.append(f"GPU {g['bus_id']}")
                continue
            stripped = line.strip()
            if stripped and ":" not in stripped:
                section = stripped
            key = line.split(":")[0].strip()
            new = _q_value(p, g, section, key)
            out.append(_set(line, new) if new is not None else line)
    return "\n".join(out).rstrip("\n") + "\n\n"


def _set(line: str, value: str) -> str:
    head, _, _ = line.partition(":")
    return f"{head}: {value}"


def _q_value(p: dict[str, Any], g: dict[str, Any], section: str, key: str) -> str | None:
    free = g.get("memory_free", g["memory_total"] - g["memory_used"] - g.get("memory_reserved", 0))
    simple = {
        "Product Name": g["name"],
        "Product Architecture": g.get("architecture", "N/A"),
        "Persistence Mode": g["persistence_mode"],
        "GPU UUID": g["uuid"],
        "Serial Number": g.get("serial", "N/A"),
        "Minor Number": str(g["index"]),
        "VBIOS Version": g.get("vbios", "N/A"),
        "Bus Id": g["bus_id"],
        "GSP Firmware Version": p["driver"],
        "Performance State": g["pstate"],
        "Compute Mode": g["compute_mode"],
        "Fan Speed": "N/A" if g["fan"] == "N/A" else f"{g['fan']} %",
        "GPU Current Temp": f"{g['temperature']} C",
        "Image Version": g.get("inforom_img"),
    }
    if section == "MIG Mode" and key in ("Current", "Pending"):
        return str(g["mig_mode"])
    if section == "ECC Mode" and key in ("Current", "Pending"):
        return str(g["ecc_mode"])
    if section == "FB Memory Usage":
        return {
            "Total": f"{g['memory_total']} MiB",
            "Reserved": f"{g.get('memory_reserved', 0)} MiB",
            "Used": f"{g['memory_used']} MiB",
            "Free": f"{free} MiB",
        }.get(key)
    if section == "GPU Power Readings" and key in (
        "Current Power Limit",
        "Requested Power Limit",
        "Default Power Limit",
        "Max Power Limit",
    ):
        return f"{g['power_limit']:.2f} W"
    if section == "Utilization" and key == "GPU":
        return f"{g['utilization']} %"
    if key == "Processes" and p.get("processes"):
        return None
    v = simple.get(key)
    return None if v is None else str(v)


LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def topo(p: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    if not gpus or not all("topo" in g for g in gpus):
        return _topo_flat(gpus)
    nics = [d for d in p.get("rdma", {}).get("devices", []) if "topo" in d]
    places = [g["topo"] for g in gpus] + [d["topo"] for d in nics]
    names = [f"GPU{g['index']}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    # R580's layout (as the A800 and H200 outputs show): tabs, an underlined header, " X "
    # on the diagonal, an extra empty cell before GPU NUMA ID, NIC rows without affinity
    out = [
        "\t\x1b[4m"
        + "".join(f"{n}\t" for n in names)
        + "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    ]
    for i, (name, a) in enumerate(zip(names, places)):
        cells = "\t".join(" X " if j == i else _link(a, b) for j, b in enumerate(places))
        tail = f"\t{a['cpus']}\t{a['numa']}\t\tN/A" if i < len(gpus) else ""
        out.append(f"{name}\t{cells}{tail}")
    text = "\n".join(out) + "\n" + LEGEND
    if nics:
        text += "\nNIC Legend:\n\n" + "".join(
            f"  NIC{i}: {d['name']}\n" for i, d in enumerate(nics)
        )
    return text


def _link(a: dict[str, Any], b: dict[str, Any]) -> str:
    if a["numa"] != b["numa"]:
        return "SYS"
    if a["bridge"] != b["bridge"]:
        return "NODE"
    if a.get("switch") is None or a.get("switch") != b.get("switch"):
        return "PHB"
    return "PIX" if a.get("leaf") == b.get("leaf") else "PXB"


def _topo_flat(gpus: list[dict[str, Any]]) -> str:
    """Profiles without placements: every GPU pair SYS, no NIC (the older profiles' output)."""
    n = len(gpus)
    head = (
        "\t\x1b[4m"
        + "".join(f"GPU{i}\t" for i in range(n))
        + "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    )
    rows = ""
    for i in range(n):
        cells = "".join(" X \t" if j == i else "SYS\t" for j in range(n))
        rows += f"GPU{i}\t{cells}0-15\t0\t\tN/A\n"
    return head + rows + LEGEND


# ---------------------------------------------------------------------- argument handling


def select(p: dict[str, Any], ids: str | None) -> list[dict[str, Any]]:
    gpus = list(p["gpus"])
    if not gpus:
        raise Exit(6, "No devices were found\n")
    if ids is None:
        return gpus
    chosen = []
    for ident in ids.split(","):
        match = [
            g
            for g in gpus
            if str(g["index"]) == ident or g["uuid"] == ident or g["bus_id"] == ident
        ]
        if not match:
            raise Exit(6, "No devices were found\n")
        chosen += match
    return chosen


P2P_LEGEND = (
    "\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n"
    "  GNS  = GPU not supported\n  TNS  = Topology not supported\n  NS   = Not supported\n"
    "  U    = Unknown\n"
)


def p2p(p: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    """`topo -p2p r|w|...`: the R5xx layout (header of GPU names, rows with a leading space,
    tabs; tests/unit/fixtures/p2p/). Every pair OK unless the profile lists ``p2p_blocked``
    pairs (``[[0, 2, "CNS"], ...]``)."""
    blocked = {(a, b): c for a, b, c in p.get("p2p_blocked", [])}
    blocked |= {(b, a): c for (a, b), c in list(blocked.items())}
    idx = [int(g["index"]) for g in gpus]
    lines = ["\t" + "\t".join(f"GPU{i}" for i in idx)]
    for a in idx:
        cells = ["X" if a == b else blocked.get((a, b), "OK") for b in idx]
        lines.append(f" GPU{a}\t" + "\t".join(cells))
    return "\n".join(lines) + "\n" + P2P_LEGEND


def run(argv: list[str]) -> str:
    p = load_profile()
    if argv[:2] == ["topo", "-p2p"]:
        return p2p(p, select(p, None))
    if argv[:1] == ["topo"]:
        return topo(p, select(p, None))
    if argv[:1] == ["nvlink"]:
        return ""
    opts: dict[str, str | None] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in (
            "--query-gpu",
            "--query-compute-apps",
            "--format",
            "-i",
            "--id",
            "-d",
            "--display",
        ):
            if not eq:
                if i + 1 >= len(argv):
                    raise Exit(
                        255,
                        f"ERROR: Option {a} requires an argument. Please run 'nvidia-smi -h'.\n\n",
                    )
                i += 1
                val = argv[i]
            opts[{"--id": "-i", "--display": "-d"}.get(name, name)] = val
        elif a in (
            "-L",
            "--list-gpus",
            "--version",
            "-q",
            "--query",
            "-x",
            "--xml-format",
            "-h",
            "--help",
            "--help-query-gpu",
        ):
            flags.add(
                {"--list-gpus": "-L", "--query": "-q", "--xml-format": "-x", "--help": "-h"}.get(
                    a, a
                )
            )
        else:
            raise Exit(255, f"ERROR: Option {a} is not recognized. Please run 'nvidia-smi -h'.\n\n")
        i += 1
    if "--version" in flags:
        return version(p)
    if "-h" in flags:
        return "NVIDIA System Management Interface -- v" + p["driver"] + " (EMULATED)\n"
    if "--help-query-gpu" in flags:
        return (DATA / "query_gpu_fields.txt").read_text()
    gpus = select(p, opts.get("-i"))
    if "--query-gpu" in opts:
        return query_gpu(p, gpus, opts["--query-gpu"] or "", opts.get("--format"))
    if "--query-compute-apps" in opts:
        return query_apps(p, gpus, opts["--query-compute-apps"] or "", opts.get("--format"))
    if "-L" in flags:
        return list_gpus(p, gpus)
    if "-q" in flags:
        if "-x" in flags:
            raise Exit(2, "XML output is not supported by this emulation.\n")
        return query_q(p, gpus)
    return table(p, gpus)


def main() -> int:
    try:
        sys.stdout.write(run(sys.argv[1:]))
    except Exit as e:
        sys.stdout.write(e.text)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
