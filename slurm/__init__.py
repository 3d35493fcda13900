"""sbatch templates and Slurm cluster profiles, shipped as `envport.slurm_files`.

This folder stays at the top level (the design card: `slurm/  sbatch templates
and cluster profiles`); pyproject.toml maps it into the package so a plain
`pip install .` carries it.  `envport.slurm` reads it; a project's own
`slurm/clusters/<name>.yaml` takes precedence over the profiles shipped here.
"""
