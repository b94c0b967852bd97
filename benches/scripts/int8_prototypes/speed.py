import json,sys,time,numpy as np,onnxruntime as ort
from tokenizers import Tokenizer
tok=Tokenizer.from_file('/work/main/models/out/e5-small/tokenizer.json')
paras=[]
for line in open('/work/shared/evaldata/hotpotqa/hotpot_hf_schema.jsonl'):
    ex=json.loads(line)
    for t,s in zip(ex['context']['title'],ex['context']['sentences']): paras.append(t+'. '+''.join(s))
    if len(paras)>=256: break
encs=sorted([tok.encode('passage: '+p).ids[:512] for p in paras], key=len)
def mk(p,dis=()):
    so=ort.SessionOptions(); so.intra_op_num_threads=2
    return ort.InferenceSession(p,so,providers=['CPUExecutionProvider'],disabled_optimizers=list(dis))
def run(s):
    n=0; i=0; t0=time.perf_counter()
    while i<len(encs):
        j=i
        while j<len(encs) and (j-i+1)*len(encs[j])<=max(512,len(encs[i])) and j-i<64: j+=1
        j=max(j,i+1); b=encs[i:j]; L=len(b[-1])
        ids=np.zeros((len(b),L),np.int64); m=np.zeros_like(ids)
        for k,e in enumerate(b): ids[k,:len(e)]=e; m[k,:len(e)]=1
        s.run(['sentence_embedding'],{'input_ids':ids,'attention_mask':m}); n+=int(m.sum()); i=j
    return n/(time.perf_counter()-t0)
base=mk('/work/main/models/out/e5-small/model.onnx')
for spec in sys.argv[1:]:
    p,*dis=spec.split(':')
    s=mk(p,dis); run(s); run(base)
    a=max(run(s) for _ in range(3)); b=max(run(base) for _ in range(3))
    print(f'{spec}: {a:.0f} tok/s vs fp32 {b:.0f} ratio {a/b:.2f}',flush=True)
