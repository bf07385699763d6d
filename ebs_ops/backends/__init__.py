"""Volume backends: EC2 (EBS volumes and snapshots) and local (directories and RocksDB checkpoints)."""
