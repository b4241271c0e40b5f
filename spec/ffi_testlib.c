/*
** ffi_testlib.c: C functions for the ums.ffi specs that need more than
** libc: structs of every class the x86-64 and AArch64 ABIs pass by value
** (spec/ffi_struct_spec.lua) and function pointers called back
** (spec/ffi_callback_spec.lua). Built by spec/CMakeLists.txt (the specs
** read its path from UMS_FFI_TESTLIB; run by hand, they compile this file
** with cc).
*/
struct s_pair { int a; int b; };
struct s_mixed { float x; float y; double z; };
struct s_idf { int i; double d; };
struct s_big { long long v[3]; char tag; };
struct s_nested { struct s_pair p; short arr[3]; char c; };
struct s_fa { float f[3]; };

struct s_pair pair_make(int a, int b) { struct s_pair p = {a, b}; return p; }
int pair_sum(struct s_pair p) { return p.a + p.b; }
struct s_mixed mixed_scale(struct s_mixed m, double k) {
  m.x *= (float)k; m.y *= (float)k; m.z *= k; return m;
}
struct s_idf idf_next(struct s_idf v) { v.i += 1; v.d += 0.5; return v; }
struct s_big big_add(struct s_big a, struct s_big b) {
  for (int i = 0; i < 3; i++) a.v[i] += b.v[i];
  a.tag = (char)(a.tag + b.tag);
  return a;
}
struct s_nested nested_bump(struct s_nested n) {
  n.p.a++; n.p.b--;
  for (int i = 0; i < 3; i++) n.arr[i] = (short)(n.arr[i] * 2);
  n.c++;
  return n;
}
struct s_fa fa_rev(struct s_fa v) {
  struct s_fa r = {{v.f[2], v.f[1], v.f[0]}}; return r;
}
double spread(struct s_mixed a, int x, struct s_idf b, struct s_big c,
              struct s_pair d) {
  return a.x + a.y + a.z + x + b.i + b.d + c.v[0] + c.v[1] + c.v[2] + c.tag
         + d.a + d.b;
}

struct ops {
  double (*scale)(double, float);
  int (*pick)(signed char, _Bool, unsigned short);
  const char *(*name)(const char *);
  void (*note)(int);
};
double ops_run(const struct ops *o, double x) {
  double r = o->scale(x, 0.5f);
  r += o->pick(-3, 1, 65535);
  if (o->name) r += (double)(o->name("abc") != 0);
  if (o->note) o->note(7);
  return r;
}
int call_int(int (*f)(int), int x) { return f(x); }
