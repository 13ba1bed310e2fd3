"""TextCleaner's report: the counts and rejected samples of a run (`build_report`),
written to `cleaning_report.json` and set on the output artifact (`record_report`).
"""

from __future__ import annotations

from typing import Any

from tfx import types

from corpus import cleaning

REPAIR_PREFIX = "repair:"
SAMPLES_PER_REASON = 5


def _sample(source_name: str, sample) -> dict[str, Any]:
    """A rejected record's sample as the report writes it: {"source_name", "source",
    "record"} and, for a duplicate, "kept": the same of the copy that was kept."""
    source, record, kept = sample
    out = {"source_name": source_name, "source": source, "record": record}
    if kept:
        out["kept"] = dict(zip(("source_name", "source", "record"), kept, strict=True))
    return out


def build_report(counts, samples, splits, names=()) -> dict[str, Any]:
    """Per-split, per-source and total counts: read = kept + dropped, dropped by reason.

    Args:
      counts: [((split, source_name, reason or KEPT or "repair:<kind>"), n)].
      samples: [((source_name, reason), [(source, record, kept copy's (source_name,
        source, record) or ())])], a few per key.
      splits: the split names.
      names: the sources to report even when they have no records (`data.sources`).

    Returns:
      {"total", "splits": {split: counts}, "by_source": {name: {"records_read",
      "records_kept", "records_dropped", "dropped": {reason: n}, "repaired": {kind: n},
      "rejected_samples": {reason: [sample]}}}, "rejected_samples": {reason: [[source,
      record]]} (the first few over every source), "rejected_records": {reason:
      [sample]} (the same with their source names and kept copies)}; a sample is
      {"source_name", "source", "record"} with "kept" (the same) for a duplicate.
    """
    per_split: dict[str, dict[str, Any]] = {
        s: {"read": 0, "kept": 0, "dropped": 0, "dropped_by_reason": {}, "repaired": {}}
        for s in splits
    }
    by_source: dict[str, dict[str, Any]] = {}

    def source_entry(name: str) -> dict[str, Any]:
        return by_source.setdefault(name, {
            "records_read": 0, "records_kept": 0, "records_dropped": 0, "dropped": {},
            "repaired": {}, "rejected_samples": {}})

    for name in names:
        source_entry(name)
    for (split, source_name, reason), n in counts:
        entry, source = per_split[split], source_entry(source_name)
        if reason.startswith(REPAIR_PREFIX):  # a change to a kept record, not a record
            kind = reason[len(REPAIR_PREFIX):]
            entry["repaired"][kind] = entry["repaired"].get(kind, 0) + n
            source["repaired"][kind] = source["repaired"].get(kind, 0) + n
            continue
        entry["read"] += n
        source["records_read"] += n
        if reason == cleaning.KEPT:
            entry["kept"] += n
            source["records_kept"] += n
        else:
            entry["dropped"] += n
            entry["dropped_by_reason"][reason] = entry["dropped_by_reason"].get(reason, 0) + n
            source["records_dropped"] += n
            source["dropped"][reason] = source["dropped"].get(reason, 0) + n
    merged: dict[str, list] = {}
    for (source_name, reason), xs in samples:
        ordered = sorted(xs)
        source_entry(source_name)["rejected_samples"][reason] = [
            _sample(source_name, x) for x in ordered]
        merged.setdefault(reason, []).extend((x[0], x[1], source_name, x) for x in ordered)
    firsts = {reason: sorted(xs)[:SAMPLES_PER_REASON] for reason, xs in merged.items()}
    total: dict[str, Any] = {"read": 0, "kept": 0, "dropped": 0, "dropped_by_reason": {},
                             "repaired": {}}
    for entry in per_split.values():
        for k in ("read", "kept", "dropped"):
            total[k] += entry[k]
        for group in ("dropped_by_reason", "repaired"):
            for reason, n in entry[group].items():
                total[group][reason] = total[group].get(reason, 0) + n
    assert total["read"] == total["kept"] + total["dropped"]
    return {
        "total": total,
        "splits": per_split,
        "by_source": dict(sorted(by_source.items())),
        "rejected_samples": {reason: [[source, record] for source, record, _, _ in xs]
                             for reason, xs in firsts.items()},
        "rejected_records": {reason: [_sample(name, x) for _, _, name, x in xs]
                             for reason, xs in firsts.items()},
    }


def record_report(artifact: types.Artifact, report: dict[str, Any]) -> None:
    """Sets the counts as ML Metadata custom properties of the output artifact."""
    total = report["total"]
    artifact.set_int_custom_property("records_read", total["read"])
    artifact.set_int_custom_property("records_kept", total["kept"])
    artifact.set_int_custom_property("records_dropped", total["dropped"])
    for reason, n in sorted(total["dropped_by_reason"].items()):
        artifact.set_int_custom_property(f"dropped_{reason}", n)
    for repair, n in sorted(total["repaired"].items()):
        artifact.set_int_custom_property(f"repaired_{repair}", n)
    artifact.set_json_value_custom_property("by_source", {
        name: {k: v for k, v in counts.items() if k != "rejected_samples"}
        for name, counts in report.get("by_source", {}).items()})
    artifact.set_json_value_custom_property("cleaning_report", report)
