"""Lightning in a real Jupyter kernel (tests/notebook/test_lightning_notebook.py), in the
frameworks environment: this venv's python runs tests/notebook/run_notebook_tests.py against
the agent bundle (/opt/spawnpoint: bin/spawnpoint-agent, share/spawnpoint/python), and the
kernel nbclient starts is this venv's python (ipykernel and nbclient pinned in
scripts/frameworks-requirements.txt).

    notebook_lightning_under_frameworks.py TEST...   (LightningNotebookTest.test_...)
"""

import sys

TESTS = "/opt/spawnpoint-repo/tests/notebook"

if __name__ == "__main__":
    sys.path.insert(0, TESTS)
    import run_notebook_tests

    sys.argv = [TESTS + "/run_notebook_tests.py", "--agent", "/opt/spawnpoint/bin/spawnpoint-agent",
                "--python-dir", "/opt/spawnpoint/share/spawnpoint/python",
                "--require", "lightning", "--require", "ipykernel", "--require", "nbclient"] + \
        sys.argv[1:]
    sys.exit(run_notebook_tests.main())
