	
r/*u
rnope"G T*missing"
u
ihttp://127.0.0.1:1