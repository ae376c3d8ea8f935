"""Reference environments behind one contract (installed as ``trajlake.envs``)."""
