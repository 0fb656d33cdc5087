(** The vector primitives and the nat operations the oracle maps, extracted WITHOUT the
    mapping: tests/oracle/test_prims.py runs this plain translation of the Gallina
    definitions against govern/oracle/_prims.py on many inputs. *)
From Coq Require Import Extraction List Arith Bool ZArith.
From Govern Require Import Vec ZVec.

Extraction Language JSON.

Definition ref_nat_eqb := Nat.eqb.
Definition ref_nat_ltb := Nat.ltb.
Definition ref_nat_leb := Nat.leb.
Definition ref_nat_add := Nat.add.
Definition ref_nat_log2 := Nat.log2.
Definition ref_andb := andb.
Definition ref_nat_mul := Nat.mul.
Definition ref_z_add := Z.add.
Definition ref_z_of_nat := Z.of_nat.

Extraction "_build/primref.json"
  vlen mlen viota vgather mgather vselect vadd veq vequals vnotbit vmax vnth mnth mall mor mcount
  mwhere mmark mfirst_false vrank vgeq mallat vjump vstepok ref_nat_eqb ref_nat_ltb ref_nat_leb ref_nat_add ref_nat_log2 ref_andb
  zlen zconst zcol zadd zsub zmin zmax zeq zlt zle zand zor znot zmulc zite znz zinrange ztonat mand mandn zaxpy zinand mnone vseleq
  ref_nat_mul ref_z_add ref_z_of_nat.
