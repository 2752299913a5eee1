// An empty translation unit: the target dlo_torch_pch exists to compile cmake/torch_pch.h once.
