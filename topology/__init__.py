"""NVLink/NVSwitch/XGMI domains and InfiniBand/RoCE fabrics mapped to Slurm allocations (planned)."""
