"""make help: every target of the Makefile (its .PHONY list) with a one-line description, and
what PORT=auto does."""
import re

import helpers


def test_make_help_lists_every_target():
    r = helpers.make("help")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    text = open(helpers.ROOT + "/Makefile").read()
    phony = re.search(r"^\.PHONY:((?:.*\\\n)*.*)$", text, re.M).group(1).replace("\\\n", " ").split()
    listed = dict(re.findall(r"^  make (\S+) +(\S.*)$", out, re.M))
    assert sorted(listed) == sorted(phony), (sorted(listed), sorted(phony))
    assert all(len(d) > 10 for d in listed.values()), listed
    assert "PORT=auto" in out and "mpremote" in out
