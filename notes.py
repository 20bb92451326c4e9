cases.append(dict(id="g05", source_url="https://github.com/HRNet/HRNet-Semantic-Segmentation/issues/171", repo="HRNet/HRNet-Semantic-Segmentation",
 cause="The launcher was started with --nproc_per_node larger than the number of visible GPUs (3 GPUs used), so a worker called torch.cuda.set_device(local_rank) with a local rank that has no corresponding CUDA device.",
 cause_keywords=["nproc_per_node|number of processes|more processes", "GPU|device", "invalid device ordinal|local_rank|set_device"],
 fix="Set --nproc_per_node to the number of visible GPUs (e.g. CUDA_VISIBLE_DEVICES=0,1,2 ... --nproc_per_node=3).",
 category="nproc-exceeds-visible-gpus",
 consequence_lines=[],
 evidence="Poster's follow-up comment: 'I have solved the problem. The --nproc_per_node parameter is the number of GPUs. I set it wrong' and gives the corrected command with CUDA_VISIBLE_DEVICES=0,1,2 and --nproc_per_node=3.",
 label_strength="strong", log_path="cases/g05.log"))
