"""Releases: release + quant -> repo, files, pack dir, model id and the engine config.

The release table is data (`strata/releases.json`). run.sh and docker/entrypoint.sh ask this module
through `strata resolve` (strata.cli.resolve) so the shell scripts never disagree with it, and a
refusal from here is their error message.

    release: --release, else $STRATA_RELEASE, else implied by $STRATA_HF_REPO, else by --quant /
             $STRATA_QUANT, else the table's default (swift, the embedded model)
    files:   huggingface_hub's cache layout (HF_HUB_CACHE / HF_HOME), HF_HUB_OFFLINE honoured; a
             shard belongs to the quant asked for only when its name ends in exactly that token
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from strata.config import ENV, ConfigError, LaunchConfig, layer, resolve_launch, setting
from strata.config import resolve as resolve_config

PACKAGE = Path(__file__).parent
GB = 10**9
SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
QUANT_TOKEN = re.compile(r"^(UD-)?(I?Q\d(_[0-9A-Z]+)*|BF16|F16|F32|MXFP4)$")


class ResolveError(ValueError):
    """A refusal; the message is one line and is the launcher's error message."""


def table() -> dict:
    return json.loads((PACKAGE / "releases.json").read_text())


# ---------------------------------------------------------------- release and quant


def choose_release(
    release: str | None, quant: str | None, env: Mapping[str, str] | None, tab: dict
) -> tuple[str, str]:
    """(release, why) by the documented order; unknown names are refused."""
    return _choose_release(resolve_launch(release, quant, env=env), tab)


def _choose_release(launch: LaunchConfig, tab: dict) -> tuple[str, str]:
    rel = tab["releases"]
    repo = launch.hf_repo
    implied = _release_of_repo(repo, tab) if repo else None
    name, why = launch.release, launch.release_from
    if name is not None:
        if name not in rel:
            raise ResolveError(f"{why} {name!r} is not a release (known: {', '.join(rel)})")
        if implied is not None and implied != name:
            raise ResolveError(f"STRATA_HF_REPO={repo} is a {implied} repository, not {name}")
        if repo and rel[name].get("embedded"):
            raise ResolveError(f"release {name} is embedded; STRATA_HF_REPO={repo} does not apply")
        return name, why
    if repo:
        if implied is None:
            raise ResolveError(
                f"cannot tell the release of STRATA_HF_REPO={repo}; add --release ({'|'.join(rel)})"
            )
        return implied, "STRATA_HF_REPO"
    q = (launch.quant or "").upper()
    if q:
        owners = [n for n, r in rel.items() if r["default_quant"] == q]
        offering = [n for n, r in rel.items() if q in r["quants"]]
        if owners or offering:
            return (owners or offering)[0], f"quant {q}"
        raise ResolveError(f"no release offers quant {q} (add --release and $STRATA_HF_REPO)")
    return tab["default_release"], "default"


def _release_of_repo(repo: str, tab: dict) -> str | None:
    name = repo.split("/")[-1].lower()
    hits = [
        n for n, r in tab["releases"].items() if r.get("repo_match") and r["repo_match"] in name
    ]
    return hits[0] if len(hits) == 1 else None


def choose_quant(release: str, launch: LaunchConfig, tab: dict) -> str:
    r = tab["releases"][release]
    q = (launch.quant or r["default_quant"]).upper()
    if not QUANT_TOKEN.match(q):
        raise ResolveError(f"{q!r} is not a GGUF quant name (e.g. IQ3_XXS, Q4_K_M, UD-IQ3_XXS)")
    custom_repo = bool(launch.hf_repo)
    if q not in r["quants"] and not (custom_repo and not r.get("embedded")):
        raise ResolveError(
            f"release {release} has no quant {q} (it has: {', '.join(r['quants'])})"
            + ("" if r.get("embedded") else "; a custom $STRATA_HF_REPO may carry others")
        )
    return q


# ---------------------------------------------------------------- shard names


def split_name(name: str) -> tuple[str, int, int]:
    """'A-IQ3_S-00001-of-00002.gguf' -> ('A-IQ3_S', 1, 2); a single file is shard 1 of 1."""
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    m = SHARD.search(stem)
    if m is None:
        return stem, 1, 1
    return stem[: m.start()], int(m.group(1)), int(m.group(2))


def quant_matches(name: str, quant: str) -> bool:
    """The file's name ends in exactly this quant token: IQ3_XXS never matches IQ3_S, and a
    UD- (Unsloth dynamic) file matches only when UD-... was asked for."""
    if not name.lower().endswith(".gguf"):
        return False
    base = split_name(Path(name).name)[0].upper()
    q = quant.upper()
    if not base.endswith(q):
        return False
    head = base[: -len(q)]
    if not head or head[-1] not in "-.":
        return False
    return q.startswith("UD-") or not re.search(r"(^|[-.])UD[-.]$", head)


def shard_sets(names: list[str], quant: str) -> tuple[list[list[str]], list[str]]:
    """Complete shard sets of this quant (sorted by shard), and what the incomplete ones lack."""
    groups: dict[tuple[str, str, int], dict[int, str]] = {}
    for n in names:
        if quant_matches(n, quant):
            base, k, total = split_name(Path(n).name)
            groups.setdefault((str(Path(n).parent), base, total), {})[k] = n
    complete, missing = [], []
    for (parent, base, total), got in sorted(groups.items()):
        lack = [k for k in range(1, total + 1) if k not in got]
        if lack:
            prefix = "" if parent == "." else parent + "/"
            missing += [f"{prefix}{base}-{k:05d}-of-{total:05d}.gguf" for k in lack]
        else:
            complete.append([got[k] for k in range(1, total + 1)])
    return complete, missing


def cached_files(repo: str, quant: str, cache: Path) -> tuple[list[Path] | None, list[str]]:
    """The cached files of this exact quant (snapshot refs/main first), or None and what is
    missing. A sibling quant in the cache is never returned."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snaps = root / "snapshots"
    if not snaps.is_dir():
        return None, []
    order = sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    ref = root / "refs" / "main"
    if ref.is_file():
        main = snaps / ref.read_text().strip()
        order = [main] + [p for p in order if p != main]
    missing: list[str] = []
    for snap in order:
        names = [str(p.relative_to(snap)) for p in snap.rglob("*.gguf") if p.exists()]
        complete, lack = shard_sets(names, quant)
        if complete:
            return [snap / n for n in complete[0]], []
        missing = missing or lack
    return None, missing


# ---------------------------------------------------------------- the resolution


@dataclass
class Resolution:
    release: str
    why: str
    quant: str
    repo: str | None
    license: str
    model_id: str
    pack_dir: Path
    hub_cache: Path
    offline: bool
    files: list[Path] | None  # local paths when present (embedded or cached)
    remote: list[str] = field(default_factory=list)  # names to fetch (known from the table)
    missing: list[str] = field(default_factory=list)  # shards of an incomplete cached set
    info: dict = field(default_factory=dict)  # the release's table row
    launch: LaunchConfig = field(default_factory=LaunchConfig)  # what was asked for
    floor_gb: float = 0.0  # free space to leave on the hub cache's filesystem

    @property
    def present(self) -> bool:
        return self.files is not None

    def fetch_command(self) -> str:
        if self.remote:
            return shlex.join(["hf", "download", self.repo, *self.remote])
        q = self.quant
        pats = [f"*[-.]{q}.gguf", f"*[-.]{q}-*-of-*.gguf"]
        return shlex.join(
            ["hf", "download", self.repo] + [a for p in pats for a in ("--include", p)]
        )

    def require_present(self) -> list[Path]:
        if self.files is not None:
            return self.files
        what = f"{self.release} {self.quant} ({self.repo})"
        lack = f"; missing shards: {', '.join(self.missing)}" if self.missing else ""
        mode = "offline (HF_HUB_OFFLINE=1)" if self.offline else "not in the cache"
        raise ResolveError(
            f"{what} is {mode} under {self.hub_cache}{lack}; fetch it with: {self.fetch_command()}"
        )


def resolve(
    release: str | None = None,
    quant: str | None = None,
    env: Mapping[str, str] | None = None,
    packs_dir: str | None = None,
) -> Resolution:
    launch = resolve_launch(release, quant, packs_dir, env)
    tab = table()
    name, why = _choose_release(launch, tab)
    q = choose_quant(name, launch, tab)
    r = tab["releases"][name]
    tag = f"{name}-{q.lower()}"
    res = Resolution(
        release=name,
        why=why,
        quant=q,
        repo=None if r.get("embedded") else (launch.hf_repo or r["repo"]),
        license=r["license"],
        model_id=tag,
        pack_dir=Path(launch.packs_dir) / tag,
        hub_cache=launch.hub_cache,
        offline=launch.hub_offline,
        files=None,
        info=r,
        launch=launch,
        floor_gb=tab["disk_floor_gb"] if launch.disk_floor_gb is None else launch.disk_floor_gb,
    )
    if r.get("embedded"):
        res.files = [PACKAGE / r["embedded"]]
        return res
    res.files, res.missing = cached_files(res.repo, q, res.hub_cache)
    if res.repo == r["repo"]:  # names known from the table: one `file`, or a shard set `files`
        names = r.get("files") or ([r["file"]] if r.get("file") else [])
        res.remote = [n.format(quant=q) for n in names]
    return res


# ---------------------------------------------------------------- fetching and disk


def estimate_bytes(res: Resolution) -> int:
    """About params x bits per weight of the quant's main block type (for the gate only)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    t = res.quant.removeprefix("UD-")
    while t and t not in GGMLQuantizationType.__members__:
        t = t.rsplit("_", 1)[0] if "_" in t else ""
    if not t and res.quant.removeprefix("UD-").startswith("IQ"):
        t = res.quant.removeprefix("UD-")[:3] + "_S"
    blk, size = GGML_QUANT_SIZES.get(GGMLQuantizationType.__members__.get(t), (1, 2))
    return int(res.info["params_b"] * 1e9 * size / blk)  # block bytes per block weights


def remote_files(res: Resolution) -> list[tuple[str, int | None]]:
    """The shard set to download (asks the Hub): exact-quant names with their sizes."""
    from huggingface_hub import HfApi

    api = HfApi()
    names = api.list_repo_files(res.repo)
    complete, missing = shard_sets(names, res.quant)
    if not complete:
        extra = f" (incomplete: {', '.join(missing)})" if missing else ""
        raise ResolveError(f"{res.repo} has no {res.quant} GGUF{extra}")
    sizes = {p.path: getattr(p, "size", None) for p in api.get_paths_info(res.repo, complete[0])}
    return [(n, sizes.get(n)) for n in complete[0]]


def _existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_gate(res: Resolution, download: int | None = None) -> None:
    """Refuse unless there is room for what is still to download plus the floor (on the hub
    cache's filesystem) and the pack still to build from it (on the packs' filesystem)."""
    if res.info.get("embedded"):
        return
    if res.present:
        quant_bytes, model_bytes = 0, sum(p.stat().st_size for p in res.files)
    else:
        quant_bytes = estimate_bytes(res) if download is None else download
        model_bytes = quant_bytes
    pack_bytes = 0 if (res.pack_dir / "experts.bin").exists() else model_bytes
    needs: dict[int, list] = {}  # device -> [a path on it, bytes]
    for where, n in (
        (res.hub_cache, quant_bytes + res.floor_gb * GB),
        (res.pack_dir, pack_bytes),
    ):
        probe = _existing(where)
        needs.setdefault(probe.stat().st_dev, [probe, 0])[1] += n
    for probe, need in needs.values():
        free = shutil.disk_usage(probe).free
        if free < need:
            raise ResolveError(
                f"{probe} has {free / GB:.1f} GB free; {res.release} {res.quant} needs "
                f"{need / GB:.1f} GB there (quant + pack + the {res.floor_gb:g} GB floor)"
            )


def fetch(res: Resolution) -> list[Path]:
    """Download the missing files into the hub cache, after the free-space gate."""
    if res.present:
        return res.files
    if res.offline:
        res.require_present()
    files = remote_files(res)
    known = [s for _, s in files]
    disk_gate(res, sum(known) if all(s is not None for s in known) else None)
    from huggingface_hub import hf_hub_download

    out = [Path(hf_hub_download(res.repo, n, cache_dir=str(res.hub_cache))) for n, _ in files]
    res.files = out
    return out


# ---------------------------------------------------------------- the engine config


def engine_env(
    res: Resolution, flags: Mapping[str, object], env: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """STRATA_* lines the server reads: flag > environment > per-release tuning > default.
    Checked with the same `strata.config.resolve` the server calls. Returns (env, notices)."""
    tab = table()
    key = f"{res.release}:{res.quant}"
    notes: list[str] = []
    tuning = tab["tuning"].get(key)
    if tuning is None:
        tuning = tab["tuning_fallback"]
        notes.append(f"warning: {key} is an unmeasured combination; conservative tuning {tuning}")
    # the release decides the model; absent files are the caller's to fetch (in a container,
    # the entrypoint fetches and writes the model path it sees)
    model = str(res.files[0]) if res.present else None
    asked = setting("model", env=env)
    if asked and model and asked != model:
        notes.append(f"STRATA_MODEL={asked} ignored: the release decides the model")
    values: dict[str, object] = {"model": model} if model else {}
    decided = {
        "STRATA_RELEASE": res.release,
        "STRATA_QUANT": res.quant,
        "STRATA_MODEL_ID": res.model_id,
    }
    if (res.pack_dir / "experts.bin").is_file():
        decided["STRATA_PACK"] = str(res.pack_dir.absolute())
    if res.repo and res.launch.hf_repo:
        decided["STRATA_HF_REPO"] = res.repo
    by_var = {var: name for name, (var, _) in ENV.items()}
    for var, v in decided.items():
        if var in by_var:
            values[by_var[var]] = v
    for name in ENV:
        if name in ("model", "pack", "release", "model_id"):
            continue
        v = layer(name, flags, env, tuning)
        if v is not None:
            values[name] = v
    for name in tuning:
        if name not in ENV:
            notes.append(
                f"{name} {tuning[name]} for {key} not applied: the engine has no such knob"
            )
    ctx = values.get("n_ctx")
    if ctx is not None:
        limit = res.info["max_context"]
        if not 256 <= int(ctx) <= limit:
            raise ResolveError(
                f"--max-context {ctx} is unsupported for {res.release} (256..{limit})"
            )
    budget = int(values.get("vram_budget_mib", 10240))
    if not 1281 <= budget <= 10240:  # the launcher's contract: no widening here
        raise ResolveError(f"--vram-budget-mib {budget} is outside the contract's 1281..10240 MiB")
    out = {ENV[n][0]: str(v) for n, v in values.items()}
    try:
        resolve_config({}, out)  # the server's own check: refusals surface here, not after start
    except ConfigError as e:
        raise ResolveError(str(e)) from None
    out |= decided  # read by the resolver in the container (and the engine where it knows them)
    return dict(sorted(out.items())), notes
