# Writes the hand-made GPU XMLs of this directory: lstopo's export of a synthetic topology plus
# hand-written PCI and OS devices and an NVLinkBandwidth matrix (see README.md). Run here:
#   lstopo-no-graphics -i "package:2 l3:1 numa:1(memory=34359738368) core:8 pu:2" --of xml 4.xml
#   lstopo-no-graphics -i "package:2 l3:2 numa:1(memory=17179869184) core:4 pu:2" --of xml 8.xml
#   python3 make-gpu-xml.py .
import re, sys
def make(src, out, buses, links, model, pci_dev):
    lines = open(src).read().split('\n')
    # Find each L3Cache object's closing line (the last Core of it closes with '      </object>' at L3 indent).
    res = []; gp = 1000; gpu = 0; nvml_gps = []
    depth_l3 = None
    for ln in lines:
        m = re.match(r'^(\s*)<object type="L3Cache"', ln)
        if m: depth_l3 = m.group(1)
        if depth_l3 is not None and ln == depth_l3 + '</object>':
            ind = depth_l3 + '  '
            for _ in range(per_l3):  # GPUs under each L3 (= NUMA node) object
                bus = buses[gpu]
                b = bus.split(':')[1]
                res.append(f'{ind}<object type="Bridge" gp_index="{gp}" bridge_type="0-1" depth="0" bridge_pci="0000:[{b}-{b}]">'); gp+=1
                res.append(f'{ind}  <object type="PCIDev" gp_index="{gp}" pci_busid="{bus}" pci_type="0302 [10de:{pci_dev}] [10de:1463] a1" pci_link_speed="31.507692">'); gp+=1
                res.append(f'{ind}    <info name="PCIVendor" value="NVIDIA Corporation"/>')
                res.append(f'{ind}    <info name="PCIDevice" value="{model[1]}"/>')
                res.append(f'{ind}    <object type="OSDev" gp_index="{gp}" name="cuda{gpu}" subtype="CUDA" osdev_type="5">'); gp+=1
                res.append(f'{ind}      <info name="Backend" value="CUDA"/>')
                res.append(f'{ind}      <info name="GPUVendor" value="NVIDIA Corporation"/>')
                res.append(f'{ind}      <info name="GPUModel" value="{model[0]}"/>')
                res.append(f'{ind}      <info name="CUDAGlobalMemorySize" value="{model[2]}"/>')
                res.append(f'{ind}    </object>')
                res.append(f'{ind}    <object type="OSDev" gp_index="{gp}" name="nvml{gpu}" subtype="NVML" osdev_type="1">'); nvml_gps.append(gp); gp+=1
                res.append(f'{ind}      <info name="Backend" value="NVML"/>')
                res.append(f'{ind}      <info name="GPUVendor" value="NVIDIA Corporation"/>')
                res.append(f'{ind}      <info name="GPUModel" value="{model[0]}"/>')
                res.append(f'{ind}      <info name="NVIDIAUUID" value="GPU-0000000{gpu}-beef-4e57-8a1b-00000000000{gpu}"/>')
                res.append(f'{ind}    </object>')
                res.append(f'{ind}    <object type="OSDev" gp_index="{gp}" name="card{gpu+1}" osdev_type="1"/>'); gp+=1
                res.append(f'{ind}    <object type="OSDev" gp_index="{gp}" name="renderD{128+gpu}" osdev_type="1"/>'); gp+=1
                res.append(f'{ind}  </object>')
                res.append(f'{ind}</object>')
                gpu += 1
            depth_l3 = None
        if ln.strip() == '</topology>':
            n = len(nvml_gps)
            vals = [0]*(n*n)
            for (a,b,bw) in links:
                vals[a*n+b] = bw; vals[b*n+a] = bw
            res.append(f'  <distances2 type="OSDev" nbobjs="{n}" kind="9" name="NVLinkBandwidth" indexing="gp">')
            res.append(f'    <indexes length="{len(" ".join(map(str,nvml_gps)))+1}">{" ".join(map(str,nvml_gps))} </indexes>')
            for r in range(n):
                row = " ".join(map(str, vals[r*n:(r+1)*n]))
                res.append(f'    <u64values length="{len(row)+1}">{row} </u64values>')
            res.append('  </distances2>')
        res.append(ln)
    open(out,'w').write('\n'.join(res))

A100_PCIE = ("NVIDIA A100 80GB PCIe", "GA100 [A100 PCIe 80GB]", 83886080)
A100_SXM = ("NVIDIA A100-SXM4-80GB", "GA100 [A100 SXM4 80GB]", 83886080)
per_l3 = 2
# 4 GPUs: 2 per package, NVLink bridges joining each pair (12 NVLink 3 links, 25000 MB/s each).
make('4.xml', sys.argv[1] + '/gpu4-2p-nvlink-pairs.xml',
     ['0000:17:00.0', '0000:65:00.0', '0000:b3:00.0', '0000:ca:00.0'],
     [(0,1,300000), (2,3,300000)], A100_PCIE, '20b5')
# 8 GPUs: 2 per NUMA node (2 per L3/NUMA, 2 NUMA nodes per package), fully linked within a package
# (4 NVLink 3 links between each pair), nothing across packages.
links8 = [(a,b,100000) for g in (0,4) for a in range(g,g+4) for b in range(a+1,g+4)]
make('8.xml', sys.argv[1] + '/gpu8-2p4n-nvlink-quads.xml',
     ['0000:07:00.0', '0000:0f:00.0', '0000:47:00.0', '0000:4e:00.0', '0000:87:00.0', '0000:90:00.0', '0000:b7:00.0', '0000:bd:00.0'],
     links8, A100_SXM, '20b2')
