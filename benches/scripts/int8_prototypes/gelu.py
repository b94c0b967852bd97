import onnx, sys
from onnx import helper
m=onnx.load(sys.argv[1]); g=m.graph
drop=set(); new=[]
for n in g.node:
    if n.name.endswith('.gelu_scaled'):
        p=n.name[:-len('gelu_scaled')]
        drop |= {p+s for s in ('gelu_scaled','gelu_erf','gelu_1p','gelu_mul','gelu')}
nodes=[]
for n in g.node:
    if n.name in drop:
        if n.name.endswith('.gelu'):
            p=n.name[:-len('gelu')]
            # input of gelu_scaled
            src=[x for x in g.node if x.name==p+'gelu_scaled'][0].input[0]
            nodes.append(helper.make_node('Gelu',[src],[n.output[0]],name=n.name,domain='com.microsoft'))
        continue
    nodes.append(n)
del g.node[:]; g.node.extend(nodes)
if not any(o.domain=='com.microsoft' for o in m.opset_import): m.opset_import.append(helper.make_opsetid('com.microsoft',1))
onnx.save(m,sys.argv[2])
