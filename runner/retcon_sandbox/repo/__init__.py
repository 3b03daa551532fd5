"""The git side: the one GitPython adapter, the checks run before anything is written, provenance,
and the demo repository. Every git call goes through `repo.gitrepo`."""
