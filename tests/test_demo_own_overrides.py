"""`metadist demo` refuses a training override of what it sets itself: `run_dir=X`
trained into X while the demo evaluated and reported the run under `--out` (another run,
or none); `data.store=` and `experiment=` likewise trained something the report did not
describe. One line naming the override and what to do, before anything is written."""

import pytest

from metadist import demo

pytestmark = pytest.mark.integration

SMALL = ["--entities", "30", "--length-range", "120", "160", "--meta-steps", "1", "--nproc", "1"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "override,remedy",
    [
        ("run_dir=elsewhere", "give another --out"),
        ("data.store=elsewhere", "metadist train"),
        ("+experiment=sinusoid_maml", "metadist train experiment=NAME"),
    ],
)
def test_an_override_of_the_demos_own_settings_is_refused(tmp_path, capsys, override, remedy):
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), *SMALL, override]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith(f"metadist demo: error: {override}: "), err
    assert remedy in err[0]
    assert not out.exists() and not (tmp_path / "elsewhere").exists()
