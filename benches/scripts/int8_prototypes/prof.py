import json,sys,numpy as np,onnxruntime as ort
from tokenizers import Tokenizer
tok=Tokenizer.from_file('/work/main/models/out/e5-small/tokenizer.json')
paras=[]
for line in open('/work/shared/evaldata/hotpotqa/hotpot_hf_schema.jsonl'):
    ex=json.loads(line)
    for t,s in zip(ex['context']['title'],ex['context']['sentences']): paras.append(t+'. '+''.join(s))
    if len(paras)>=128: break
encs=sorted([tok.encode('passage: '+p).ids[:512] for p in paras], key=len)
so=ort.SessionOptions(); so.intra_op_num_threads=2; so.enable_profiling=True
so.optimized_model_filepath='/tmp/q/opt_'+sys.argv[1].split('/')[-1]
s=ort.InferenceSession(sys.argv[1],so,providers=['CPUExecutionProvider'])
for i in range(0,len(encs),4):
    b=encs[i:i+4]; L=len(b[-1]); ids=np.zeros((len(b),L),np.int64); m=np.zeros_like(ids)
    for k,e in enumerate(b): ids[k,:len(e)]=e; m[k,:len(e)]=1
    s.run(['sentence_embedding'],{'input_ids':ids,'attention_mask':m})
p=s.end_profiling(); d=json.load(open(p)); agg={}
for e in d:
    if e.get('cat')=='Node' and e['name'].endswith('_kernel_time'):
        op=e['args']['op_name']; agg[op]=agg.get(op,0)+e['dur']
tot=sum(agg.values())
for k,v in sorted(agg.items(),key=lambda x:-x[1])[:14]: print(f'{k:28} {v/1e3:8.1f} ms {100*v/tot:5.1f}%')
