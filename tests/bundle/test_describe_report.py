"""`edgeflash inspect` describes a bundle whose quality report is malformed instead of failing on it:
the report only informs, and the manifest it sits in may have been edited and sealed again."""

from __future__ import annotations

import json

from edgeflash.runtime.bundle.describe import render


def test_a_report_row_without_its_role_is_one_line_not_a_traceback(smol_bundle):
    manifest = json.loads((smol_bundle / "manifest.json").read_text())
    rows = [t for t in manifest["report"]["tensors"] if t.get("sqnr_db") is not None and len(t["shape"]) > 1]
    assert rows, "the export measured no tensor's SQNR"
    whole = render(manifest, blocks=False)
    assert "SQNR by role" in whole and "malformed" not in whole
    del rows[0]["role"]
    text = render(manifest, blocks=False)
    assert "quality report: not shown, its fields are malformed" in text and "'role'" in text
    assert text.split("\n\n")[0] == whole.split("\n\n")[0]  # the weights are still described
