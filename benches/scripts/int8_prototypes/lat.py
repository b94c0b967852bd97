import time,numpy as np,onnxruntime as ort,sys
sys.path.insert(0,'/work/main/models'); import convert as C
from tokenizers import Tokenizer
tok=Tokenizer.from_file('/work/main/models/out/e5-small/tokenizer.json')
q="query: Which magazine was started first, Arthur's Magazine or First for Women?"
h=q+" Arthur's Magazine (1844-1846) was an American literary periodical published in Philadelphia in the 19th century."
for th in (1,2):
  so=C.int8_session_options(th)
  s=ort.InferenceSession('/work/main/models/out/e5-small-int8/model.onnx',so,providers=['CPUExecutionProvider'])
  for t in (q,h):
    ids=np.array([tok.encode(t).ids],np.int64); f={'input_ids':ids,'attention_mask':np.ones_like(ids)}
    for _ in range(5): s.run(['sentence_embedding'],f)
    ts=[]
    for _ in range(50):
      t0=time.perf_counter(); s.run(['sentence_embedding'],f); ts.append((time.perf_counter()-t0)*1e3)
    print(f'threads {th} tokens {ids.shape[1]}: p50 {np.median(ts):.2f} ms')
