"""Shared types and the area engine: findings and their registry (model), the concurrent area runner
(engine), the launch environment (launchenv), CUDA_VISIBLE_DEVICES (visible_devices) and the one
ranks-per-node judgement every launcher path uses (placement). Pure apart from the engine's threads."""
