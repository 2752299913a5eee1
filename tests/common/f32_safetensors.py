"""A .safetensors file of float32 tensors written with the standard library alone (the shell tests
run Debian's python3, which has no torch): save(path, {name: (shape, values)}), header padded to 8."""
import json
import struct


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
